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

function plainGradients(g) {
  return { value: g.value, params: Object.fromEntries([...g.params].map(([name, a]) => [name, Array.from(a)])),
    src: plainMatrix(g.srcEmbedding), tgt: plainMatrix(g.tgtEmbedding) };
}

// the seed of a gradient case: the label-smoothed loss of `labels`, or log p(token) (- log p(contrast)) at `row`
function seedOf(c) {
  return c.labels ? { labels: c.labels, smoothing: c.smoothing ?? 0, scale: c.scale ?? 1 }
    : { row: c.row, token: c.token, contrast: c.contrast ?? null };
}

// the loss (or objective) alone, from a forward pass without a tape
function valueOf(c) {
  const logits = engine.matrix(c.tgt.length, model.config.tgt_vocab);
  model.forward(c.src, c.tgt, { off: c.off || [] }).logits.forEach((row, i) => logits.data.set(row, i * logits.cols));
  const seed = seedOf(c);
  return seed.labels ? engine.labelSmoothedLoss(logits, seed.labels, seed.smoothing, model.config.pad_id, seed.scale).value
    : engine.logProbObjective(logits, seed.row, seed.token, seed.contrast).value;
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
    case "grad": {                         // every weight's and both embeddings' gradients of one objective
      return plainGradients(engine.gradients(model, c.src, c.tgt, seedOf(c), { off: c.off || [], weights: c.weights ?? true }));
    }
    case "fd": {                           // central differences (L(w + h) - L(w - h)) / 2h at picked weights
      const g = engine.gradients(model, c.src, c.tgt, seedOf(c), { off: c.off || [] });
      const analytic = [], numeric = [];
      for (const [name, index] of c.picks) {
        const w = loaded.tensors.get(name).data, saved = w[index];
        w[index] = saved + c.h;
        const up = valueOf(c);
        w[index] = saved - c.h;
        const down = valueOf(c);
        w[index] = saved;
        numeric.push((up - down) / (2 * c.h));
        analytic.push(g.params.get(name)[index]);
      }
      return { analytic, numeric };
    }
    case "attribute": {                    // the whole `glassformer attribute --json` object of one sentence
      const target = c.out === null ? engine.attributionTarget(model, c.src) : engine.attributionTarget(model, c.src, c.out);
      const tokenizers = engine.loadTokenizers(loaded.vocab);
      const report = engine.attributeReport(model, { srcIds: c.src, tgtInIds: target.tgtInIds, targetIds: target.targetIds,
        sourceUnits: c.units, targetTokens: c.pieces ?? engine.targetPieces(model, (id) => tokenizers.target.idToToken(id), target.targetIds),
        contrast: c.contrast ?? null, contrastToken: c.contrastToken ?? null,
        decode: (ids) => tokenizers.target.decode(ids) }, c.opts || {});
      return { target, report };
    }
    case "attribution_patching":
      return engine.attributionPatching(model, c.clean, c.corrupt, c.tgt, c.row, c.token, { positions: c.positions ?? true });
    case "train_steps": {                  // optimiser steps from the bundle's weights on given batches
      const optimizer = new engine.Adam(loaded.tensors);
      const o = engine.checkTrainOptions(c.opts || {});
      const losses = c.batches.map((pairs) => engine.trainStep(model, optimizer, pairs, o).loss);
      return { losses, tensors: Object.fromEntries([...loaded.tensors].map(([name, t]) => [name, Array.from(t.data)])) };
    }
    case "learn": {                        // a toy trained from its seed: held-out exact match before and after
      const trainer = new engine.Trainer(c.opts);
      const before = trainer.evaluate();
      const result = engine.trainUntilDone(trainer);
      return { before, ...result, heldOut: trainer.heldOut, validation: trainer.validationSet,
        drawn: Array.from({ length: 200 }, () => trainer.drawTraining()) };
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
