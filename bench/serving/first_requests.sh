#!/usr/bin/env bash
# The first requests a fresh deployment serves: starts a store shard, the router, a prefill and a
# decode worker (each its own process, on loopback, KV through shared memory), sends three
# requests of ~1,600 prompt tokens one after another (no shared prefix), prints `tandem
# generate`'s summary of each (prefill, kv transfer, first token), and stops the roles. Extra
# arguments go to the shard and the workers (e.g. --set cache_store.preallocate=true).
#
#   bench/serving/first_requests.sh TANDEM_BINARY [--set key=value ...]
#
# docs/benchmarks.md ("Workers attach as they start") runs it on two builds in turn.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 TANDEM_BINARY [--set key=value ...]" >&2; exit 2; }
tandem=$1; shift
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d)
pids=()
finish() {
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2> /dev/null || true
    wait "${pids[i]}" 2> /dev/null || true
  done
  rm -rf "$work"
}
trap finish EXIT
# start ROLE ARGS...: sets `address` once the role serves (60 s at most).
start() {
  local role=$1; shift
  "$tandem" "$role" --model "$repo/models/tandem-py-8l" --set model.threads=1 "$@" \
    --listen 127.0.0.1:0 --metrics-listen "" > "$work/$role.out" 2> "$work/$role.log" &
  pids+=($!)
  for _ in $(seq 1200); do
    grep -q "serving on" "$work/$role.out" 2> /dev/null && break
    kill -0 "${pids[-1]}" 2> /dev/null || break
    sleep 0.05
  done
  address=$(sed -n 's/.*serving on \([^;]*\);.*/\1/p' "$work/$role.out")
  [ -n "$address" ] || { echo "the $role did not start: $(tail -3 "$work/$role.log")" >&2; exit 1; }
}
start cache-store "$@"
shard=$address
start router
router=$address
for role in prefill decode; do
  start $role --set "cache_store.shards=[$shard]" --set "$role.router=$router" \
    --set "$role.advertise=127.0.0.1" "$@"
done
for _ in $(seq 1200); do
  [ "$(grep -c ' registered at ' "$work/router.log")" -ge 2 ] && break
  sleep 0.05
done
prompt=$(head -c 4000 "$repo/common/store/arena_client.cc")
for i in 1 2 3; do
  "$tandem" generate --addr "$router" --prompt "$i $prompt" --max-tokens 4 --ignore-eos \
    --timeout 60 2>&1 > /dev/null | tail -1 | sed "s/^generate:/request $i:/"
done
