// The page's engine on a bundle, for benchmarks/lab_float16.py: node lab_engine.mjs ENGINE_DIR JOB.json OUT.json
// JOB: {"bundle": path, "translate": [{"text", "beam"}], "forced": [{"src": ids, "tgt": ids}], "probs": path,
//       "attribute": [{"text", "target", "method", "steps"}]}
// OUT: {"load_ms", "translations": [string], "forced_rows", "attributions": [glassformer attribute --json]}; the
// softmax of every forced row (float64, row after row, case after case) goes to the binary file `probs`. The
// page's own path: loadBundle, the tokenizers, generate, attributeReport.
import { readFileSync, writeFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { join, resolve } from "node:path";

const [engineDir, jobPath, outPath] = process.argv.slice(2);
const engine = await import(pathToFileURL(join(resolve(engineDir), "index.js")).href);
const { loadTokenizers } = await import(pathToFileURL(join(resolve(engineDir), "tokenize.js")).href);
const job = JSON.parse(readFileSync(jobPath, "utf8"));
const t0 = performance.now();
const loaded = engine.loadBundle(JSON.parse(readFileSync(job.bundle, "utf8")));
const model = new engine.Transformer(loaded.config, loaded.tensors);
const { source, target } = loadTokenizers(loaded.vocab);
const loadMs = performance.now() - t0;

const translations = (job.translate || []).map(({ text, beam }) => {
  const ids = source.analyse(text).ids;
  return ids.length ? target.decode(engine.generate(model, ids, { beam, lengthPenalty: 1.0 }).tokens) : "";
});

const rows = [];
for (const { src, tgt } of job.forced || []) {
  for (const logits of model.forward(src, tgt).logits) rows.push(engine.softmaxRow(logits));
}
const pieceOf = (id) => target.idToToken(id);
const attributions = (job.attribute || []).map(({ text, target: english, method, steps }) => {
  const enc = source.analyse(text);
  const rows = engine.attributionTarget(model, enc.ids, english === null ? null : target.encode(english));
  return engine.attributeReport(model, { srcIds: enc.ids, tgtInIds: rows.tgtInIds, targetIds: rows.targetIds,
    sourceUnits: enc.units, targetTokens: engine.targetPieces(model, pieceOf, rows.targetIds),
    decode: (ids) => target.decode(ids) }, { method, steps });
});

if (job.probs) {
  const width = rows.length ? rows[0].length : 0;
  const flat = new Float64Array(rows.length * width);
  rows.forEach((row, i) => flat.set(row, i * width));
  writeFileSync(job.probs, Buffer.from(flat.buffer));
}
writeFileSync(outPath, JSON.stringify({ load_ms: loadMs, translations, forced_rows: rows.length, attributions }));
