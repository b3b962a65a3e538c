// Runs exercise cases for tests/test_exercises_js.py: node exercises_cases.mjs ENGINE_DIR JOB.json OUT.json
// JOB: {"cases": [{"op": "sheet" | "check", "kind", "seed", "norm", "mask", "decimals", "answers"}]}
// OUT: one result per case; tables with null for -inf (JSON has no infinities); an ExerciseError as {"error"}.
import { readFileSync, writeFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { join, resolve } from "node:path";

const [engineDir, jobPath, outPath] = process.argv.slice(2);
const ex = await import(pathToFileURL(join(resolve(engineDir), "exercises.js")).href);
const job = JSON.parse(readFileSync(jobPath, "utf8"));

const plain = (t) => t.map((row) => row.map((v) => (Number.isFinite(v) ? v : null)));

function sheetOf(c) {
  return ex.newExerciseSheet(c.kind, c.seed, { norm: c.norm, mask: c.mask, decimals: c.decimals, asked: c.asked });
}

function run(c) {
  const sheet = sheetOf(c);
  if (c.op === "sheet") {
    const key = ex.exerciseKey(sheet);
    return { doc: sheet.doc, asked: sheet.asked, audit: sheet.audit,
      key: Object.fromEntries(Object.entries(key).map(([p, t]) => [p, plain(t)])) };
  }
  if (c.op === "check") return ex.checkExercise(sheet, ex.parseExerciseAnswers(c.answers, sheet));
  if (c.op === "audit") {                   // the audit of the seed's sheet with `ask` as the asked cells
    sheet.asked = c.ask;
    return ex.auditExercise(sheet);
  }
  throw new Error(`unknown op ${c.op}`);
}

const started = performance.now();
const results = job.cases.map((c) => {
  try { return run(c); } catch (err) {
    if (err instanceof ex.ExerciseError) return { error: err.message, field: err.field };
    throw err;
  }
});
writeFileSync(outPath, JSON.stringify({ ms: performance.now() - started, results }));
