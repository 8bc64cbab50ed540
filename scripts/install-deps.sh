#!/usr/bin/env bash
# Installs every Debian package Tandem needs to build, test and benchmark.
# Idempotent: packages already present are skipped without touching the network.
# With TANDEM_DEPS=build (the container images' build stage) only what building needs.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libabsl-dev nlohmann-json3-dev libxxhash-dev
  libpcre2-dev libutf8proc-dev        # tokenizer: pre-tokenizer regexes, NFC/NFKC
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler  # services
  libyaml-cpp-dev prometheus-cpp-dev  # configuration, /metrics
  libboost1.74-dev                    # the HTTP front door: Boost.Beast over Asio (headers)
  libssl-dev                          # TLS between roles: certificate checks at startup
  libdnnl-dev                         # oneDNN: model.cpu_gemm: onednn (AMX/AVX-512 GEMMs)
  libucx-dev ucx-utils                # UCX: the KV fabric (cache_store.transport: ucx); ucx_info
                                      # and ucx_perftest to check a node's transports
  curl                                # demo: the HTTP API and /metrics
  zlib1g-dev                          # model-inspect: PNG attention maps
  libgtest-dev libgmock-dev libbenchmark-dev
)
if [ "${TANDEM_DEPS:-all}" != build ]; then
  packages+=(
    clang libclang-rt-14-dev            # libFuzzer targets, sanitizers
    python3 python3-numpy python3-torch libopenblas0-pthread  # test-time numerical reference
    python3-grpcio python3-grpc-tools   # integration tests: a gRPC client Tandem did not write
    openssl                             # scripts/dev-certs.sh: test certificates
    prometheus python3-yaml             # deploy tests: promtool, a real Prometheus scraping
  )
  # Node.js and npm run the tokenizer conformance oracle and the Kubernetes schema validation
  # (npm packages, test time); kubectl renders the kustomize overlays. Machines that ship their
  # own keep them; otherwise Debian's.
  command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
  command -v kubectl >/dev/null 2>&1 || packages+=(kubernetes-client)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
