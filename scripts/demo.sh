#!/usr/bin/env bash
# Installs what is missing, builds Tandem and shows it generating.
# Until the bundled trained model and the serving path land, the demo writes a small random
# Llama-architecture model and runs it through the engine with `model-inspect generate`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build model-inspect make-random-model

model=build/demo-model
if [ ! -f "$model/config.json" ]; then
  build/tools/make_random_model/make-random-model --out "$model" --preset 125m --seed 1
fi
echo "== model"
build/tools/model_inspect/model-inspect info --model "$model"
echo "== KV cache sizing"
build/tools/model_inspect/model-inspect --kv-cache --model "$model" --context 4096 --memory 8GiB
echo "== generate 32 tokens (greedy) from the prompt ids 1,15043,29892,590"
build/tools/model_inspect/model-inspect generate --model "$model" --tokens 1,15043,29892,590 \
  --max-tokens 32 --ignore-eos
