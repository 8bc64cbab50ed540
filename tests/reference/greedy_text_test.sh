#!/usr/bin/env bash
# The bundled model completes a fixed prompt greedily into fixed text: catches any change in
# tokenization, weights loading or the forward pass that shifts a greedy choice.
# usage: greedy_text_test.sh MODEL_INSPECT MODEL_DIR EXPECTED_FILE
set -euo pipefail
model_inspect=$1 model=$2 expected=$3
prompt=$(head -n 1 "$expected")
max_tokens=$(sed -n 2p "$expected")
want=$(tail -n +3 "$expected")
# generate prints the ids on one line, then the text.
got=$("$model_inspect" generate --model "$model" --prompt "$prompt" --max-tokens "$max_tokens" \
        --ignore-eos 2>/dev/null | tail -n +2)
if [ "$got" != "$want" ]; then
  echo "FAIL: greedy completion of '$prompt' changed"
  echo "--- want"
  echo "$want"
  echo "--- got"
  echo "$got"
  exit 1
fi
echo "PASS: $max_tokens greedy tokens after '$prompt' are the recorded text"
