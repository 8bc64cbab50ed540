// Compares oracle and Tandem renders of one template, conversation by conversation.
// usage: node compare.js NAME ORACLE_JSONL TANDEM_JSONL
// A conversation is identical when both rendered the same bytes, or both failed (a template
// that raises on a conversation must raise in both). Exits 1 on any difference.
'use strict';
const fs = require('fs');
const [name, oracleFile, tandemFile] = process.argv.slice(2);
const read = (f) => {
  const text = fs.readFileSync(f, 'utf8').trim();
  return new Map(text ? text.split('\n').map((l) => JSON.parse(l)).map((r) => [r.id, r]) : []);
};
const want = read(oracleFile);
const got = read(tandemFile);
let identical = 0;
let errors = 0;
const shown = [];
const show = (s) => JSON.stringify(s);
for (const [id, w] of want) {
  const g = got.get(id);
  if (g && w.ok && g.ok && w.text === g.text) {
    identical++;
    continue;
  }
  if (g && !w.ok && !g.ok) {
    identical++;
    errors++;
    continue;
  }
  let detail;
  if (!g) {
    detail = 'missing from Tandem output';
  } else if (w.ok !== g.ok) {
    detail = w.ok ? `Tandem failed: ${g.error}\n      oracle: ${show(w.text)}`
                  : `oracle failed: ${w.error}\n      tandem: ${show(g.text)}`;
  } else {
    let i = 0;
    while (i < w.text.length && w.text[i] === g.text[i]) i++;
    const from = Math.max(0, i - 40);
    detail = `first difference at char ${i}:\n      oracle: ${show(w.text.slice(from, i + 60))}` +
             `\n      tandem: ${show(g.text.slice(from, i + 60))}`;
  }
  shown.push(`  ${id}: ${detail}`);
}
console.log(`${name}: ${want.size} conversations compared, ${identical} identical` +
            ` (${errors} of them raise in both)`);
shown.slice(0, 10).forEach((s) => console.log(s));
process.exit(identical === want.size && want.size > 0 ? 0 : 1);
