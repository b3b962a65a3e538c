// Runs engine cases for tests/test_engine.py: node run_cases.mjs ENGINE_DIR JOB.json OUT.json
// JOB: {"bundle": path to a bundle JSON, "cases": [{"kind": ..., ...}]}; OUT: one result per case.
// ENGINE_DIR lets a test point at a copy of the engine with a planted bug.
import { readFileSync, writeFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { join, resolve } from "node:path";

const [engineDir, jobPath, outPath] = process.argv.slice(2);
const engine = await import(pathToFileURL(join(resolve(engineDir), "index.js")).href);
const job = JSON.parse(readFileSync(jobPath, "utf8"));
const started = performance.now();
const loaded = job.bundle ? engine.loadBundle(JSON.parse(readFileSync(job.bundle, "utf8"))) : null;
const model = loaded ? new engine.Transformer(loaded.config, loaded.tensors) : null;
const loadMs = performance.now() - started;

function plainMatrix(m) {
  return { rows: m.rows, cols: m.cols, data: Array.from(m.data, (v) => (Number.isFinite(v) ? v : null)) };
}

function plainProbes(probes) {
  return Object.fromEntries([...probes].map(([name, m]) => [name, plainMatrix(m)]));
}

// A model for search cases: next-token log-probabilities looked up by the prefix generated so far (BOS left out,
// ids joined by ",") in c.table {prefix: {id: log-probability}}, every other id -inf; `steps`: the most tokens
// one beam has fed it (the search's steps)
function scriptedModel(c) {
  const model = {
    config: { pad_id: c.pad, bos_id: c.bos, eos_id: c.eos, max_len: c.modelMaxLen },
    steps: 0,
    encode: () => null,
    newCache: () => ({ prefix: null, clone() { return { ...this }; } }),
    decodeStep(token, encoded, cache) {
      cache.prefix = cache.prefix === null ? [] : [...cache.prefix, token];
      model.steps = Math.max(model.steps, cache.prefix.length + 1);
      const row = c.table[cache.prefix.join(",")];
      if (!row) throw new Error(`no table row for the prefix [${cache.prefix}]`);
      const logits = new Float64Array(c.vocab).fill(-Infinity);
      for (const [id, value] of Object.entries(row)) logits[Number(id)] = value;
      return { logits };
    },
  };
  return model;
}

function run(c) {
  switch (c.kind) {
    case "forward": {
      const opts = { record: c.record ?? true, off: c.off || [] };
      if (c.patch) {                       // activation patching: these probes from the clean source's run
        const clean = model.forward(c.patch.src, c.tgt, { record: c.patch.names }).probes;
        opts.intervene = Object.fromEntries(c.patch.names.map((name) => [name, () => clean.get(name)]));
      }
      const out = model.forward(c.src, c.tgt, opts);
      return { logits: out.logits.map((row) => Array.from(row)), probes: plainProbes(out.probes) };
    }
    case "steps": {                        // incremental decoding: each step's logits
      const encoded = model.encode(c.src);
      const cache = model.newCache();
      return { logits: c.tgt.map((id) => Array.from(model.decodeStep(id, encoded, cache, { off: c.off || [] }).logits)) };
    }
    case "greedy": return { ids: engine.greedy(model, c.src, { maxLen: c.maxLen }) };
    case "beam": return { ids: engine.beamSearch(model, c.src, { beam: c.beam, lengthPenalty: c.alpha ?? 1.0, maxLen: c.maxLen }) };
    case "next": return { top: engine.nextDistribution(model, c.src, c.prefix, { off: c.off || [], top: c.top ?? 10 }) };
    case "patching": return engine.patchingTable(model, c.clean, c.corrupt, c.tgt, c.row, c.token, { positions: c.positions ?? true });
    case "lens": return engine.logitLens(model, c.src, c.tgt, c.row, c.token, c.contrast ?? null);
    case "alti": return plainMatrix(engine.altiPlus(model, c.src, c.tgt));
    case "trace": return engine.runTrace(c.doc);
    case "error": {
      try { run(c.case); } catch (error) { return { error: String(error.message) }; }
      return { error: null };
    }
    case "time": {                         // milliseconds of one call, the best of `repeat`
      let best = Infinity, result = null;
      for (let r = 0; r < (c.repeat ?? 3); r++) {
        const t0 = performance.now();
        result = run(c.case);
        best = Math.min(best, performance.now() - t0);
      }
      return { ms: best, result };
    }
    case "scripted": return c.searches.map((s) => {     // the search's rules on a table (scriptedModel)
      const scripted = scriptedModel(c);
      const hyp = engine.generate(scripted, [], { beam: s.beam, lengthPenalty: s.alpha, maxLen: s.maxLen });
      return { ...hyp, steps: scripted.steps };
    });
    default: throw new Error(`unknown case kind ${c.kind}`);
  }
}

const results = job.cases.map(run);
writeFileSync(outPath, JSON.stringify({ load_ms: loadMs, results }));
