#!/usr/bin/env bash
# The bundled model completes a fixed prompt greedily into fixed text: catches any change in
# tokenization, weights loading or the forward pass that shifts a greedy choice.
# usage: greedy_text_test.sh MODEL_INSPECT MODEL_DIR EXPECTED_FILE [GENERATE_FLAG ...]
# Extra flags (--cpu-gemm onednn) must give the same text; exit 77 (skipped) where oneDNN has no
# matmul for the model's dtype on this CPU.
set -euo pipefail
model_inspect=$1 model=$2 expected=$3
shift 3
prompt=$(head -n 1 "$expected")
max_tokens=$(sed -n 2p "$expected")
want=$(tail -n +3 "$expected")
# generate prints the ids on one line, then the text.
err=$(mktemp)
trap 'rm -f "$err"' EXIT
if ! out=$("$model_inspect" generate --model "$model" --prompt "$prompt" --max-tokens "$max_tokens" \
             --ignore-eos "$@" 2>"$err"); then
  if grep -q "onednn has no" "$err"; then
    echo "SKIP: $(tail -n 1 "$err")"
    exit 77
  fi
  cat "$err"
  exit 1
fi
got=$(echo "$out" | tail -n +2)
if [ "$got" != "$want" ]; then
  echo "FAIL: greedy completion of '$prompt' changed"
  echo "--- want"
  echo "$want"
  echo "--- got"
  echo "$got"
  exit 1
fi
echo "PASS: $max_tokens greedy tokens after '$prompt' are the recorded text${*:+ (with $*)}"
