#!/usr/bin/env bash
# Offline validation of Tandem's Kubernetes manifests: renders every overlay with
# `kubectl kustomize`, checks every object against the Kubernetes OpenAPI schemas (npm
# kubernetes-models, @kubernetes-models/prometheus-operator for the PodMonitor) including unknown
# fields, then Tandem's own policy (validate.mjs), and with --tandem parses each overlay's config
# with `tandem config --config` and starts a store shard with it on loopback. Needs kubectl (with kustomize), node and npm; the npm registry
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

  # What parsing cannot see (a transport the shard's memory cannot serve, say): each overlay's
  # store shard starts with its config and serves. Only what needs the cluster is replaced: the
  # addresses (loopback), the certificates (a dev CA, where the config has TLS), the disk tier's
  # place and size, and RDMA (UCX over TCP here).
  certs="$work/certs"
  [ -f "$certs/cache_store.pem" ] || "$repo/scripts/dev-certs.sh" "$certs" > /dev/null
  for arg in "${overlay_args[@]}"; do
    name=${arg%%=*}
    config="$work/config/$name/tandem.yaml"
    [ -f "$config" ] || continue
    sets=(--set cache_store.capacity_bytes=64MiB
          --set "cache_store.disk.directory=$work/kv/$name" --set cache_store.disk.capacity_bytes=16MiB
          --set cache_store.disk.segment_bytes=4MiB)
    if grep -q "ca_file:" "$config"; then
      sets+=(--set "security.tls.ca_file=$certs/ca.pem" --set "security.tls.cert_file=$certs/cache_store.pem"
             --set "security.tls.key_file=$certs/cache_store.key")
    fi
    out="$work/config/$name/cache-store.out"
    log="$work/config/$name/cache-store.log"
    rm -rf "$work/kv/$name"
    UCX_TLS=tcp,self "$tandem" cache-store --config "$config" --listen 127.0.0.1:0 \
      --metrics-listen "" "${sets[@]}" > "$out" 2> "$log" &
    pid=$!
    # Its "serving on" line, within 60 s (polled: the process may also exit first).
    for _ in $(seq 600); do
      grep -q "serving on" "$out" 2> /dev/null && break
      kill -0 "$pid" 2> /dev/null || break
      sleep 0.1
    done
    if grep -q "serving on" "$out"; then
      kill -TERM "$pid"
      wait "$pid" || { echo "FAIL [$name] the store shard did not stop cleanly on SIGTERM" >&2; status=1; }
    else
      kill -KILL "$pid" 2> /dev/null || true
      wait "$pid" 2> /dev/null || true
      echo "FAIL [$name] a store shard with the overlay's config did not start: $(tail -3 "$log")" >&2
      status=1
    fi
  done
  summary="$summary; store shards: checked"
fi

if [ $status -ne 0 ]; then
  echo "validate.sh: FAILED (${summary:-nothing validated})" >&2
  exit 1
fi
echo "validate.sh: ok ($summary)"
