// The dependency-free Node checker published in seed 000 (shared/seeds/000_*.txt, "Run a fail-closed
// split validator"), reformatted; the baseline isplan check is measured against.
import { readFile } from 'node:fs/promises';
const configPath = process.argv[2] ?? 'config.json';
const splitText = process.argv[3] ?? '14,8,8,8,8,8,8,16';
const config = JSON.parse(await readFile(configPath, 'utf8'));
const split = splitText.split(',').map(Number);
const fail = (message) => { console.error(`INVALID: ${message}`); process.exit(1); };
if (!split.every((n) => Number.isInteger(n) && n > 0)) fail('every stage count must be a positive integer');
if (split.reduce((a, b) => a + b, 0) !== config.num_hidden_layers) fail(`stage counts must sum to ${config.num_hidden_layers}`);
if (config.indexer_types.length !== config.num_hidden_layers) fail('indexer_types does not cover every hidden layer');
let start = 1;
for (const [index, count] of split.entries()) {
  const type = config.indexer_types[start - 1];
  if (type !== 'full') { let source = start - 1; while (source > 0 && config.indexer_types[source - 1] !== 'full') source--; fail(`stage ${index + 1} starts at shared layer ${start}; source is ${source}`); }
  console.log(`stage ${index + 1}: ${start}-${start + count - 1} (${type})`);
  start += count;
}
console.log('VALID: every stage starts on a full indexer layer');
