// Reference token ids from @lenml/tokenizers (transformers.js) for the conformance test.
// usage: node oracle.js NODE_MODULES_DIR VOCAB TEXT_FILE > ids.txt
// Prints, for each line of TEXT_FILE (without its newline), the ids comma-separated.
'use strict';
const fs = require('fs');
const path = require('path');

const [nodeModules, vocab, textFile] = process.argv.slice(2);
if (!textFile) {
  console.error('usage: node oracle.js NODE_MODULES_DIR VOCAB TEXT_FILE');
  process.exit(2);
}
const pkg = require(path.join(nodeModules, '@lenml', `tokenizer-${vocab}`));
const tokenizer = pkg.fromPreTrained();
let text = fs.readFileSync(textFile, 'utf8');
if (text.endsWith('\n')) text = text.slice(0, -1);
const out = [];
for (const line of text.split('\n')) {
  out.push(tokenizer.encode(line, {add_special_tokens: false}).join(','));
}
process.stdout.write(out.join('\n') + '\n');
