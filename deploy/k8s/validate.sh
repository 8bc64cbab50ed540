#!/usr/bin/env bash
# Offline validation of Tandem's Kubernetes manifests: renders every overlay with
# `kubectl kustomize`, checks every object against the Kubernetes OpenAPI schemas (npm
# kubernetes-models, @kubernetes-models/prometheus-operator for the PodMonitor) including unknown
# fields, then Tandem's own policy (validate.mjs), and with --tandem parses each overlay's config
# with `tandem config --config`, starts every role with it on loopback (a store shard, the
# router, a prefill and a decode worker registered with it) and streams a completion through
# them. Needs kubectl (with kustomize), node and npm; the npm registry
# only for the first run (packages are installed once into WORK/npm).
# usage: deploy/k8s/validate.sh [--tandem PATH_TO_TANDEM_BINARY] [--work DIR]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
tandem=""
work="${TMPDIR:-/tmp}/tandem-k8s-validate"

usage() { echo "usage: $0 [--tandem PATH_TO_TANDEM_BINARY] [--work DIR]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --tandem) [ $# -ge 2 ] || usage; tandem=$2; shift 2 ;;
    --work) [ $# -ge 2 ] || usage; work=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
done
if [ -n "$tandem" ]; then
  tandem=$(cd "$(dirname "$tandem")" && pwd)/$(basename "$tandem")
  [ -x "$tandem" ] || { echo "FAIL: --tandem $tandem is not an executable" >&2; exit 1; }
fi
mkdir -p "$work"
work=$(cd "$work" && pwd)
cd "$repo"

for tool in kubectl node npm; do
  if ! command -v "$tool" >/dev/null; then
    echo "FAIL: '$tool' is not installed; validate.sh needs kubectl, node and npm" >&2
    exit 1
  fi
done

# npm install once per work dir; reruns reuse node_modules.
packages="kubernetes-models@5.1.0 @kubernetes-models/prometheus-operator@6.0.0 @kubernetes-models/cert-manager@6.0.0 yaml@2.9.1"
stamp="$work/npm/installed-$(echo "$packages" | tr ' /@' '+_-')"
if [ ! -f "$stamp" ]; then
  mkdir -p "$work/npm"
  echo '{"private": true}' > "$work/npm/package.json"
  # shellcheck disable=SC2086
  if ! (cd "$work/npm" && npm install --no-audit --no-fund --loglevel=error $packages); then
    echo "FAIL: npm install of $packages failed (is the npm registry reachable?)" >&2
    exit 1
  fi
  touch "$stamp"
fi

status=0
overlay_args=()
for dir in deploy/k8s/overlays/*/; do
  name=$(basename "$dir")
  out="$work/rendered/$name.yaml"
  mkdir -p "$work/rendered"
  if ! kubectl kustomize "$dir" > "$out"; then
    echo "FAIL [$name] kubectl kustomize $dir failed" >&2
    status=1
    continue
  fi
  overlay_args+=("$name=$out")
done
[ ${#overlay_args[@]} -gt 0 ] || { echo "FAIL: no overlay rendered" >&2; exit 1; }

rm -rf "$work/config"
if ! summary=$(node deploy/k8s/validate.mjs "$work/npm/node_modules" "$work/config" "${overlay_args[@]}"); then
  status=1
fi

if [ -n "$tandem" ]; then
  for arg in "${overlay_args[@]}"; do
    name=${arg%%=*}
    config="$work/config/$name/tandem.yaml"
    if [ ! -f "$config" ]; then
      echo "FAIL [$name] no tandem.yaml config to check" >&2; status=1; continue
    fi
    if ! "$tandem" config --config "$config" > "$work/config/$name/effective.yaml"; then
      echo "FAIL [$name] '$tandem config --config' rejected the ConfigMap's tandem.yaml" >&2
      status=1
    fi
  done
  summary="$summary; tandem config: checked"

  # What parsing cannot see (a transport the shard's memory cannot serve, say): with each
  # overlay's config, every role starts on loopback (a store shard, the router, a prefill and a
  # decode worker that register with it, as the pods do) and the router streams a completion
  # to an API-key client over TLS. Only what needs the cluster is replaced: the addresses, the
  # certificates (a dev CA, one per role, where the config has TLS), the model (the bundled
  # one, on the CPU: no GPU here), the memory and disk sizes, and RDMA (UCX over TCP here).
  certs="$work/certs"
  [ -f "$certs/cache_store.pem" ] || "$repo/scripts/dev-certs.sh" "$certs" > /dev/null
  key_out=$("$tandem" api-key validate 2> /dev/null)
  api_key=$(sed -n 's/^key: *//p' <<< "$key_out")
  sed -n 's/^line: *//p' <<< "$key_out" > "$work/api-keys.txt"
  pids=()
  stop_all() {  # SIGTERM to every role started, newest first; 0 when all exited cleanly
    local ok=0 i
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
      kill -TERM "${pids[i]}" 2> /dev/null || true
      wait "${pids[i]}" || ok=1
    done
    pids=()
    return $ok
  }
  kill_all() { for pid in "${pids[@]}"; do kill -KILL "$pid" 2> /dev/null || true; done; }
  trap kill_all EXIT
  # start_role NAME ROLE ARGS...: starts `tandem ROLE` and sets `address` to where it serves
  # and `metrics` to its /metrics URL, within 60 s; returns 1 (and says why) if it exits or
  # never says.
  start_role() {
    local name=$1 role=$2; shift 2
    local out="$work/config/$name/$role.out" log="$work/config/$name/$role.log"
    UCX_TLS=tcp,self "$tandem" "$role" "$@" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
      > "$out" 2> "$log" &
    pids+=($!)
    for _ in $(seq 600); do
      grep -q "serving on" "$out" 2> /dev/null && break
      kill -0 "${pids[-1]}" 2> /dev/null || break
      sleep 0.1
    done
    address=$(sed -n 's/.*serving on \([^;]*\);.*/\1/p' "$out" | head -1)
    metrics=$(sed -n 's/.*; metrics \(http[^;]*\).*/\1/p' "$out" | head -1)
    if [ -z "$address" ]; then
      echo "FAIL [$name] the $role did not start with the overlay's config: $(tail -3 "$log")" >&2
      return 1
    fi
  }
  for arg in "${overlay_args[@]}"; do
    name=${arg%%=*}
    config="$work/config/$name/tandem.yaml"
    [ -f "$config" ] || continue
    rm -rf "$work/kv/$name"
    common=(--config "$config" --set "model.path=$repo/models/tandem-py-8l" --set model.device=cpu
            --set model.threads=1 --set kv_cache.memory_bytes=64MiB
            --set cache_store.capacity_bytes=64MiB --set "cache_store.disk.directory=$work/kv/$name"
            --set cache_store.disk.capacity_bytes=16MiB --set cache_store.disk.segment_bytes=4MiB)
    has_tls=0
    ca=()
    if grep -q "ca_file:" "$config"; then
      has_tls=1
      ca=(--ca-file "$certs/ca.pem")
    fi
    tls=()
    tls_for() {  # sets `tls` to the flags that give role $1 its dev certificate
      tls=()
      [ $has_tls = 1 ] || return 0
      tls=(--set "security.tls.ca_file=$certs/ca.pem" --set "security.tls.cert_file=$certs/$1.pem"
           --set "security.tls.key_file=$certs/$1.key")
    }
    ok=1
    tls_for cache_store
    if start_role "$name" cache-store "${common[@]}" "${tls[@]}"; then
      common+=(--set "cache_store.shards=[$address]")
    else
      ok=0
    fi
    tls_for router
    if [ $ok = 1 ] && start_role "$name" router "${common[@]}" "${tls[@]}" \
         --set "security.api_keys_file=$work/api-keys.txt"; then
      router_address=$address
      router=${address/127.0.0.1/localhost}  # the name its certificate is checked against
      router_log="$work/config/$name/router.log"
      for role in prefill decode; do
        [ $ok = 1 ] || break
        tls_for $role
        start_role "$name" $role "${common[@]}" "${tls[@]}" --set "$role.router=$router_address" \
          --set "$role.advertise=127.0.0.1" || ok=0
        [ $role = prefill ] && prefill_metrics=$metrics
      done
      # Both workers registered (the router logs each), within 60 s.
      for _ in $(seq 600); do
        [ $ok = 1 ] || break
        [ "$(grep -c " registered at " "$router_log")" -ge 2 ] && break
        sleep 0.1
      done
      if [ $ok = 1 ] && [ "$(grep -c " registered at " "$router_log")" -lt 2 ]; then
        echo "FAIL [$name] the workers did not register with the router: $(tail -3 "$router_log")" >&2
        ok=0
      fi
    else
      ok=0
    fi
    # A prompt of a few KV blocks (16 tokens each), so that blocks cross the store.
    prompt=$'def quicksort(arr):\n    """Sorts arr."""\n    if len(arr) <= 1:\n        return arr\n    pivot = arr[0]\n'
    if [ $ok = 1 ] && ! "$tandem" generate --addr "$router" "${ca[@]}" --api-key "$api_key" \
         --wait-ready --timeout 60 --prompt "$prompt" --max-tokens 8 --ignore-eos \
         > "$work/config/$name/generate.out" 2> "$work/config/$name/generate.log"; then
      echo "FAIL [$name] the overlay's roles did not serve a completion:" \
        "$(tail -3 "$work/config/$name/generate.log")" >&2
      ok=0
    fi
    # The blocks moved as they would between the overlay's pods, which share no memory: over
    # UCX where the config asks for it, else in the gRPC stream.
    want=grpc
    grep -q 'transport: "ucx"' "$work/config/$name/effective.yaml" && want=ucx
    if [ $ok = 1 ]; then
      moved=$(curl -sf "$prefill_metrics" | grep '^tandem_kv_transport_transfers_total{' |
              grep 'direction="put"' | grep 'result="ok"' | grep "transport=\"$want\"" |
              awk '{s += $2} END {print s + 0}')
      if [ "${moved:-0}" -lt 1 ]; then
        echo "FAIL [$name] the prefill worker put no blocks over $want ($prefill_metrics)" >&2
        ok=0
      fi
    fi
    if ! stop_all; then
      echo "FAIL [$name] a role did not stop cleanly on SIGTERM (logs in $work/config/$name)" >&2
      ok=0
    fi
    [ $ok = 1 ] || status=1
  done
  trap - EXIT
  summary="$summary; every role started with each overlay's config and served a completion, its KV blocks through the shard"
fi

if [ $status -ne 0 ]; then
  echo "validate.sh: FAILED (${summary:-nothing validated})" >&2
  exit 1
fi
echo "validate.sh: ok ($summary)"
