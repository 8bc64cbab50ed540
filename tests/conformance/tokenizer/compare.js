// Compares oracle ids with Tandem ids line by line.
// usage: node compare.js VOCAB ORACLE_IDS TANDEM_IDS MIN_RATE
'use strict';
const fs = require('fs');
const [vocab, oracleFile, tandemFile, minRate] = process.argv.slice(2);
const read = (f) => fs.readFileSync(f, 'utf8').replace(/\n$/, '').split('\n');
const want = read(oracleFile);
const got = read(tandemFile);
if (want.length !== got.length) {
  console.log(`${vocab}: line count differs: oracle ${want.length}, tandem ${got.length}`);
  process.exit(1);
}
let same = 0;
const shown = [];
want.forEach((w, i) => {
  if (w === got[i]) {
    same++;
  } else if (shown.length < 5) {
    shown.push(`  line ${i + 1}:\n    oracle: ${w}\n    tandem: ${got[i]}`);
  }
});
const rate = same / want.length;
console.log(`${vocab}: ids match on ${same}/${want.length} lines (${(100 * rate).toFixed(2)}%)`);
shown.forEach((s) => console.log(s));
process.exit(rate >= Number(minRate) ? 0 : 1);
