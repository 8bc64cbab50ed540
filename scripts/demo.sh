#!/usr/bin/env bash
# Installs what is missing, builds Tandem, starts `tandem serve` on the bundled model (its default
# on one CPU: colocated, the router and a decode worker serving whole requests, in one process)
# and streams completions from it with `tandem generate`; then the same disaggregated (router,
# prefill worker, cache-store shard and decode worker in one process, gRPC on loopback). The bundled model is
# models/tandem-py-8l, a small Llama-architecture model trained on the Python standard library by
# scripts/train_model.py.
set -euo pipefail
cd "$(dirname "$0")/.."

# Only what building and serving need (TANDEM_DEPS=build): the test tools (torch, clang,
# Prometheus, Node.js, kubectl) are scripts/test.sh's to install.
TANDEM_DEPS=build scripts/build.sh build -- tandem model-inspect

model=models/tandem-py-8l
tandem=build/tools/tandem/tandem
echo "== model"
build/tools/model_inspect/model-inspect info --model "$model"

# Starts `tandem serve` with extra arguments "$@"; sets serve_pid, addr, http, metrics; prints
# the startup line (which mode it chose, and why).
serve() {
  log=$(mktemp)
  "$tandem" serve --model "$model" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --http-listen 127.0.0.1:0 "$@" >"$log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 300); do
    grep -q "router on" "$log" && break
    kill -0 "$serve_pid" 2>/dev/null || { cat "$log"; exit 1; }
    sleep 0.1
  done
  grep "router on" "$log"
  addr=$(grep -o 'router on [^;]*' "$log" | cut -d' ' -f3)
  http=$(grep -o '; http [^;]*' "$log" | cut -d' ' -f3)
  metrics=$(grep -o 'http://[^;]*/metrics' "$log")
}
stop() {
  kill -TERM "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null || true
  rm -f "$log"
}
trap stop EXIT

echo "== tandem serve --model $model"
serve

prompt='def quicksort(arr):'
echo "== tandem generate --prompt '$prompt' (greedy, 96 tokens, streamed)"
"$tandem" generate --addr "$addr" --prompt "$prompt" --max-tokens 96
echo "== the same, sampled (temperature 0.8, top-p 0.95, seed 7)"
"$tandem" generate --addr "$addr" --prompt "$prompt" --max-tokens 96 \
  --temperature 0.8 --top-p 0.95 --seed 7
echo "== the OpenAI-compatible HTTP API at http://$http (curl; any OpenAI client works)"
echo "\$ curl http://$http/v1/completions -d '{\"prompt\": \"$prompt\", \"max_tokens\": 24, \"temperature\": 0}'"
curl -s "http://$http/v1/completions" -H 'Content-Type: application/json' \
  -d "{\"prompt\": \"$prompt\", \"max_tokens\": 24, \"temperature\": 0}"
echo
echo "== chat (POST /v1/chat/completions): the model's own chat template renders the messages"
curl -s "http://$http/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "system", "content": "Sorting helpers."}, {"role": "user", "content": "Write quicksort"}], "max_tokens": 24, "temperature": 0}'
echo
echo "== the completion again, streamed as server-sent events (stream: true)"
curl -sN "http://$http/v1/completions" -H 'Content-Type: application/json' \
  -d "{\"prompt\": \"$prompt\", \"max_tokens\": 6, \"temperature\": 0, \"stream\": true}"
echo "== a few of the metrics at $metrics"
if command -v curl >/dev/null; then
  curl -s "$metrics" | grep -E '^tandem_(requests_total|generation_tokens_total|time_to_first_token_seconds_(sum|count))\{' \
    | grep 'role="router"' || true
fi
stop

echo "== tandem serve --set serve.mode=disaggregated: prefill worker -> cache store -> decode worker"
serve --set serve.mode=disaggregated
long_prompt='import os
import sys


def main(argv):
    """Parse the command line and run the program."""'
echo "== a longer prompt (greedy, 48 tokens): its whole KV blocks cross the store (\"kv transfer\")"
"$tandem" generate --addr "$addr" --prompt "$long_prompt" --max-tokens 48
