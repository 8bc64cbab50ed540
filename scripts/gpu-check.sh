#!/usr/bin/env bash
# Verifies the CUDA backend on a machine with an NVIDIA GPU, in two steps, because the GPU
# machines this project borrows have the CUDA toolkit and a driver but none of Tandem's Debian
# build dependencies (gRPC, Abseil, protobuf ...) and no network:
#
#   scripts/gpu-check.sh pack     # here (a build machine with nvcc): builds build-cuda/ with
#                                 # TANDEM_CUDA=ON and copies the GPU test binaries, engine-bench
#                                 # and the shared libraries they need (not CUDA's) into .gpu/
#   scripts/gpu-check.sh run      # there, from the checkout with .gpu/ carried along: runs
#                                 # every `cuda` test and engine-bench on the GPU, prints a
#                                 # summary table and exits non-zero if anything failed
#
# `run` never builds; `pack` never needs a GPU. .gpu/ is ignored by git (.git/info/exclude).
# Environment: CUDA_ARCHS (default 90, the H100/H200), GPU_CHECK_MODEL (default the bundled
# model) for engine-bench.
set -euo pipefail
cd "$(dirname "$0")/.."

pack() {
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  scripts/install-deps.sh
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90}" >/dev/null
  local binaries=(tests/unit/kernels/backend_test tests/unit/model/model_cuda_test
                  bench/engine-bench)
  ninja -C build-cuda backend_test model_cuda_test engine-bench
  rm -rf .gpu
  mkdir -p .gpu/bin .gpu/lib
  grep -qxF '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
  for b in "${binaries[@]}"; do
    strip -o ".gpu/bin/$(basename "$b")" "build-cuda/$b"
    # Libraries from Debian packages (the GPU machine has glibc, libstdc++ and CUDA's own).
    ldd "build-cuda/$b" | awk '$3 ~ /^\// {print $3}' |
      grep -vE '/(libc|libm|libgcc_s|libstdc\+\+|libpthread|libdl|librt|ld-linux[^/]*)\.so|/libcu|/libnv' |
      while read -r lib; do cp -Ln "$lib" .gpu/lib/ 2>/dev/null || true; done
  done
  strip --strip-unneeded .gpu/lib/* 2>/dev/null || true
  cp -r models/tandem-py-8l .gpu/model
  echo "packed .gpu/: $(du -sh .gpu | cut -f1) (the device tool carries at most 64 MiB)"
}

run() {
  [ -d .gpu/bin ] || { echo "no .gpu/: run 'scripts/gpu-check.sh pack' on a build machine"; exit 2; }
  export LD_LIBRARY_PATH="$PWD/.gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  local out=${OUT:-/tmp/gpu-check}
  mkdir -p "$out"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  local summary=() failed=0
  for t in backend_test model_cuda_test; do
    if .gpu/bin/$t --gtest_brief=1 >"$out/$t.log" 2>&1; then
      summary+=("$t|passed|$(grep -c '^\[       OK \]' "$out/$t.log" || true) cases")
    else
      summary+=("$t|FAILED|see $t.log")
      failed=1
    fi
    tail -n 30 "$out/$t.log"
  done
  local model=${GPU_CHECK_MODEL:-.gpu/model}
  if .gpu/bin/engine-bench --model "$model" --device cuda --prompt-lens 128,2048 --batches 1,64 \
       --decode-steps 16 --repeats 3 >"$out/engine-bench.log" 2>&1; then
    summary+=("engine-bench|ran|see engine-bench.log")
  else
    summary+=("engine-bench|FAILED|$(tail -n 1 "$out/engine-bench.log")")
  fi
  cat "$out/engine-bench.log"
  echo
  echo "| check | result | detail |"
  echo "|---|---|---|"
  for row in "${summary[@]}"; do echo "| ${row//|/ | } |"; done
  exit "$failed"
}

case "${1:-}" in
  pack) pack ;;
  run) run ;;
  *) echo "usage: scripts/gpu-check.sh pack|run" >&2; exit 2 ;;
esac
