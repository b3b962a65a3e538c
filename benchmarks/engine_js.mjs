// The page engine's gradient budgets in Node (benchmarks/engine_js.py drives it):
//   node engine_js.mjs ENGINE_DIR JOB.json OUT.json
// JOB: {"bundle": path or null, "sentences": [{"src": ids, "out": ids, "units": [...]}], "ig_steps": 32,
//       "train": [{...train options}], "repeat": 3}
// OUT: {"sentences": [{source, rows, forward_ms, backward_ms, saliency_ms, ig_ms}], "train": [{seed, steps, seconds,
//       cpu_seconds, ms_per_step, accuracy, mirrored}]}: each timing [wall ms, CPU ms], the best of `repeat` (integrated
//       gradients: once); each training run once.
import { readFileSync, writeFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { join, resolve } from "node:path";

const [engineDir, jobPath, outPath] = process.argv.slice(2);
const engine = await import(pathToFileURL(join(resolve(engineDir), "index.js")).href);
const job = JSON.parse(readFileSync(jobPath, "utf8"));
const out = {};

// the best of `repeat` calls: [wall ms, this process's CPU ms] (CPU time: what an idle core would take, roughly,
// when other jobs share the machine)
function best(repeat, fn) {
  let ms = Infinity, cpu = Infinity;
  for (let r = 0; r < repeat; r++) {
    const t0 = performance.now(), c0 = process.cpuUsage();
    fn();
    const c = process.cpuUsage(c0);
    ms = Math.min(ms, performance.now() - t0);
    cpu = Math.min(cpu, (c.user + c.system) / 1000);
  }
  return [ms, cpu];
}

if (job.bundle) {
  const loaded = engine.loadBundle(JSON.parse(readFileSync(job.bundle, "utf8")));
  const model = new engine.Transformer(loaded.config, loaded.tensors);
  const repeat = job.repeat ?? 3;
  out.sentences = job.sentences.map(({ src, out: ids, units }) => {
    const target = engine.attributionTarget(model, src, ids);
    const sentence = { srcIds: src, tgtInIds: target.tgtInIds, targetIds: target.targetIds, sourceUnits: units,
      targetTokens: target.targetIds.map((id) => `▁${id}`) };
    const pass = engine.tapedPass(model, src, target.tgtInIds, { weights: false });
    return {
      source: src.length, rows: target.targetIds.length,
      forward_ms: best(repeat, () => model.forward(src, target.tgtInIds)),
      backward_ms: best(repeat, () => pass.backward(engine.logProbObjective(pass.logits, 0, target.targetIds[0]).grad)),
      saliency_ms: best(repeat, () => engine.attributeReport(model, sentence, { method: "saliency" })),
      ig_ms: best(1, () => engine.attributeReport(model, sentence, { method: "integrated-gradients", steps: job.ig_steps ?? 32 })),
    };
  });
}

out.train = (job.train || []).map((opts) => {
  const c0 = process.cpuUsage();
  const result = engine.runTraining(opts);
  const cpu = process.cpuUsage(c0);
  const n = result.example.source.length;
  const mirrored = result.example.cross_attention.filter((row, i) => row.indexOf(Math.max(...row)) === n - 1 - i).length;
  return { seed: opts.seed, task: opts.task ?? "reverse", steps: result.steps, seconds: result.seconds,
    cpu_seconds: (cpu.user + cpu.system) / 1e6,
    ms_per_step: (1000 * result.seconds) / Math.max(result.steps, 1), accuracy: result.accuracy,
    validation: result.validation, mirrored: mirrored / result.example.cross_attention.length };
});
writeFileSync(outPath, JSON.stringify(out));
