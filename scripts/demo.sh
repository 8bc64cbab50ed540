#!/usr/bin/env bash
# Installs what is missing, builds Tandem and shows it generating with the bundled model
# (models/tandem-py-8l: a small Llama-architecture model trained on the Python standard library
# by scripts/train_model.py). Until `tandem serve` lands, generation runs through the engine
# with `model-inspect generate`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build model-inspect

model=models/tandem-py-8l
inspect=build/tools/model_inspect/model-inspect
echo "== model"
"$inspect" info --model "$model"
echo "== KV cache sizing"
"$inspect" --kv-cache --model "$model" --context 2048 --memory 1GiB
prompt='def quicksort(arr):'
echo "== complete '$prompt' (greedy, 96 tokens)"
"$inspect" generate --model "$model" --prompt "$prompt" --max-tokens 96 | tail -n +2
echo "== the same, sampled (temperature 0.8, top-p 0.95, seed 7)"
"$inspect" generate --model "$model" --prompt "$prompt" --max-tokens 96 \
  --temperature 0.8 --top-p 0.95 --seed 7 | tail -n +2
