// Reference renders from @huggingface/jinja for the chat template conformance test.
// usage: node oracle.js NODE_MODULES_DIR MODEL_DIR CONVERSATIONS_JSON SELECTED_OUT > oracle.jsonl
// Reads MODEL_DIR's template (chat_template.jinja, else tokenizer_config.json's chat_template;
// the "default" entry of the list form), keeps the conversations whose "requires" the template
// supports, writes them to SELECTED_OUT for the Tandem side, and prints one JSON line per
// conversation: {"id", "ok", "text"} or {"id", "ok": false, "error"}.
// Exits 3 when the model has no chat template, 4 when the oracle cannot parse it.
'use strict';
const fs = require('fs');
const path = require('path');

const [nodeModules, modelDir, conversationsFile, selectedOut] = process.argv.slice(2);
if (!selectedOut) {
  console.error('usage: node oracle.js NODE_MODULES_DIR MODEL_DIR CONVERSATIONS_JSON SELECTED_OUT');
  process.exit(2);
}
const {Template} = require(path.join(nodeModules, '@huggingface', 'jinja'));

const config = JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer_config.json'), 'utf8'));
let source = null;
const jinjaFile = path.join(modelDir, 'chat_template.jinja');
if (fs.existsSync(jinjaFile)) {
  source = fs.readFileSync(jinjaFile, 'utf8');
} else if (typeof config.chat_template === 'string') {
  source = config.chat_template;
} else if (Array.isArray(config.chat_template)) {
  const entry = config.chat_template.find((t) => t.name === 'default');
  source = entry ? entry.template : null;
}
if (source === null) {
  console.error('no chat template');
  process.exit(3);
}

// What a conversation may rely on, judged from the template text.
const supports = {
  content_parts: /\[['"]text['"]\]|\.text\b/.test(source),
  tool_calls: /tool_calls/.test(source),
  tojson_arguments: /arguments\s*\|\s*tojson/.test(source),
};
const conversations = JSON.parse(fs.readFileSync(conversationsFile, 'utf8'))
    .filter((c) => c.requires.every((r) => supports[r]));
fs.writeFileSync(selectedOut, JSON.stringify(conversations));

const token = (t) => (typeof t === 'string' ? t : t && typeof t.content === 'string' ? t.content : '');
const tokens = {};
for (const key of ['bos_token', 'eos_token']) {
  if (token(config[key]) !== '') tokens[key] = token(config[key]);
}

let template;
try {
  template = new Template(source);
} catch (e) {
  console.error(`oracle cannot parse the template: ${e.message}`);
  process.exit(4);
}
const out = [];
for (const c of conversations) {
  const context = Object.assign(JSON.parse(JSON.stringify(c.context)), tokens);
  try {
    out.push(JSON.stringify({id: c.id, ok: true, text: template.render(context)}));
  } catch (e) {
    out.push(JSON.stringify({id: c.id, ok: false, error: String(e.message)}));
  }
}
process.stdout.write(out.join('\n') + '\n');
