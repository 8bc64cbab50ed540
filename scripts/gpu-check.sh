#!/usr/bin/env bash
# Verifies the CUDA backend on a machine with an NVIDIA GPU, in two steps, because the GPU
# machines this project borrows have the CUDA toolkit and a driver but none of Tandem's Debian
# build dependencies (gRPC, Abseil, protobuf ...) and no network:
#
#   scripts/gpu-check.sh pack     # here (a build machine with nvcc): builds build-cuda/ with
#                                 # TANDEM_CUDA=ON and copies the GPU test binaries, tandem,
#                                 # model-inspect, make-random-model, engine-bench and the shared
#                                 # libraries they need (not CUDA's, gzipped) into .gpu/
#   scripts/gpu-check.sh run      # there, from the checkout with .gpu/ carried along: runs
#                                 # every `cuda` test; `tandem serve` with GPU prefill and
#                                 # decode, and with GPU prefill and CPU decode, on the bundled
#                                 # model and the 1B-shaped random model, each checked against
#                                 # the CPU engine's greedy tokens; engine-bench on the GPU.
#                                 # Prints a summary table; non-zero if anything failed.
#
# `run` never builds; `pack` never needs a GPU. .gpu/ is ignored by git (.git/info/exclude).
# Environment: CUDA_ARCHS (default 90, the H100/H200), GPU_CHECK_MODEL (default the bundled
# model) for engine-bench, GPU_CHECK_CPU_GEMM=1 to also time the host CPU's GEMM providers
# (own kernels against oneDNN) where it has AMX.
set -euo pipefail
cd "$(dirname "$0")/.."

pack() {
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  scripts/install-deps.sh
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90}" >/dev/null
  local binaries=(tests/unit/kernels/backend_test tests/unit/model/model_cuda_test
                  bench/engine-bench tools/tandem/tandem tools/model_inspect/model-inspect
                  tools/make_random_model/make-random-model)
  ninja -C build-cuda backend_test model_cuda_test engine-bench tandem model-inspect \
    make-random-model
  rm -rf .gpu
  mkdir -p .gpu/bin .gpu/lib
  mkdir -p .git/info
  grep -qxF '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
  for b in "${binaries[@]}"; do
    strip -o ".gpu/bin/$(basename "$b")" "build-cuda/$b"
    # Libraries from Debian packages (the GPU machine has glibc, libstdc++ and CUDA's own).
    ldd "build-cuda/$b" | awk '$3 ~ /^\// {print $3}' |
      grep -vE '/(libc|libm|libgcc_s|libstdc\+\+|libpthread|libdl|librt|ld-linux[^/]*)\.so|/libcu|/libnv' |
      while read -r lib; do cp -Ln "$lib" .gpu/lib/ 2>/dev/null || true; done
  done
  strip --strip-unneeded .gpu/lib/* 2>/dev/null || true
  # The libraries compressed: oneDNN alone is 40 MB, and the device tool carries 64 MiB.
  tar -czf .gpu/lib.tar.gz -C .gpu lib
  rm -rf .gpu/lib
  cp -r models/tandem-py-8l .gpu/model
  echo "packed .gpu/: $(du -sh .gpu | cut -f1) (the device tool carries at most 64 MiB)"
}

# `tandem serve` on MODEL with prefill on $2 and decode on $3; its greedy tokens for a prompt
# must equal model-inspect's on the CPU. The CPU runs its own kernels (f32 inputs to every
# matrix, as the CUDA backend), not oneDNN's bf16 matmul that `auto` takes on an AMX host.
serve_matches_cpu() {
  local model=$1 prefill=$2 decode=$3 log=$4
  .gpu/bin/tandem serve --model "$model" --listen 127.0.0.1:0 --metrics-listen "" \
    --set serve.prefill_device="$prefill" --set serve.decode_device="$decode" \
    --set model.cpu_gemm=tandem >"$log.out" 2>"$log" &
  local pid=$! addr=""
  for _ in $(seq 600); do
    addr=$(grep -o 'router on [^;]*' "$log.out" 2>/dev/null | cut -d' ' -f3)
    [ -n "$addr" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.2
  done
  local ok=1
  if [ -n "$addr" ]; then
    local got want
    got=$(.gpu/bin/tandem generate --addr "$addr" --tokens 1,450,1200,77,9,31,2000,5 \
            --max-tokens 32 --print-ids 2>>"$log" | tail -n 1)
    want=$(.gpu/bin/model-inspect generate --model "$model" --tokens 1,450,1200,77,9,31,2000,5 \
             --max-tokens 32 --cpu-gemm tandem 2>>"$log" | head -n 1)
    echo "gpu: $got" >>"$log"
    echo "cpu: $want" >>"$log"
    [ -n "$got" ] && [ "$got" = "$want" ] && ok=0
  fi
  cat "$log.out" >>"$log"
  kill $pid 2>/dev/null; wait $pid 2>/dev/null || true
  return $ok
}

run() {
  [ -d .gpu/bin ] || { echo "no .gpu/: run 'scripts/gpu-check.sh pack' on a build machine"; exit 2; }
  [ -d .gpu/lib ] || tar -xzf .gpu/lib.tar.gz -C .gpu
  export LD_LIBRARY_PATH="$PWD/.gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  local out=${OUT:-/tmp/gpu-check}
  mkdir -p "$out"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  local summary=() failed=0
  for t in backend_test model_cuda_test; do
    # On the GPU machine a skipped case means the GPU was not found: that fails the check.
    if .gpu/bin/$t --gtest_brief=1 >"$out/$t.log" 2>&1 && ! grep -q '^\[  SKIPPED \]' "$out/$t.log"; then
      summary+=("$t|passed|$(grep '^\[  PASSED  \]' "$out/$t.log")")
    else
      summary+=("$t|FAILED|see $t.log")
      failed=1
    fi
    tail -n 30 "$out/$t.log"
  done
  # Serving: greedy tokens of `tandem serve` on the GPU against the CPU engine's
  # (model-inspect generate), for both models and both placements.
  local big=/tmp/gpu-check-1b
  [ -f "$big/config.json" ] ||
    .gpu/bin/make-random-model --out "$big" --preset 1b --seed 1 >"$out/make-random-model.log" 2>&1
  for model in .gpu/model "$big"; do
    for placement in "cuda cuda" "cuda cpu"; do
      set -- $placement
      local name="serve $(basename "$model") prefill=$1 decode=$2"
      if serve_matches_cpu "$model" "$1" "$2" "$out/serve-$(basename "$model")-$1-$2.log"; then
        summary+=("$name|passed|greedy tokens equal the CPU engine's")
      else
        summary+=("$name|FAILED|see serve-$(basename "$model")-$1-$2.log")
        failed=1
      fi
    done
  done
  local model=${GPU_CHECK_MODEL:-$big}
  if .gpu/bin/engine-bench --model "$model" --device cuda --prompt-lens 128,2048 --batches 1,64 \
       --decode-steps 16 --repeats 3 >"$out/engine-bench.log" 2>&1; then
    summary+=("engine-bench $(basename "$model")|ran|see the table above")
  else
    summary+=("engine-bench $(basename "$model")|FAILED|$(tail -n 1 "$out/engine-bench.log")")
    failed=1
  fi
  cat "$out/engine-bench.log"
  # The host CPU's GEMM providers (issue #25) on 2 threads, where it has AMX, when asked for
  # (GPU_CHECK_CPU_GEMM=1: about 3 minutes of device time).
  if [ "${GPU_CHECK_CPU_GEMM:-0}" = 1 ] && grep -qw amx_bf16 /proc/cpuinfo; then
    for g in tandem onednn; do
      if .gpu/bin/engine-bench --model "$big" --cpu-gemm "$g" --threads 2 \
           --weight-memory hugepages --prompt-lens 512 --batches 1,32 --decode-steps 16 \
           --repeats 3 >"$out/cpu-gemm-$g.log" 2>&1; then
        summary+=("engine-bench 1b cpu-gemm=$g|ran|see its table above")
      else
        summary+=("engine-bench 1b cpu-gemm=$g|FAILED|$(tail -n 1 "$out/cpu-gemm-$g.log")")
        failed=1
      fi
      cat "$out/cpu-gemm-$g.log"
    done
  fi
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
