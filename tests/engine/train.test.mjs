// Training and attribution pieces of the engine that need no model bundle: `node --test tests/engine/`.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as engine from "../../src/glassformer/lab/static/engine/index.js";

test("a bad training option is one line naming the field and its limit", () => {
  const cases = [
    [{ d_model: 4096 }, "d_model", /MAX_TOY_D_MODEL = 128/],
    [{ batch: 65 }, "batch", /MAX_TOY_BATCH = 64/],
    [{ max_length: 25 }, "max_length", /MAX_TOY_LENGTH = 24/],
    [{ task: "translate" }, "task", /copy, reverse, sort, grammar/],
    [{ heads: 3 }, "heads", /not a multiple/],
    [{ lr: "fast" }, "lr", /a number/],
    [{ min_length: 9, max_length: 7 }, "min_length", /over max_length/],
    [{ colour: "red" }, "colour", /unknown option/],
  ];
  for (const [opts, field, message] of cases) {
    assert.throws(() => engine.checkTrainOptions(opts), (error) => error.field === field && message.test(error.message) &&
      !error.message.includes("\n"), JSON.stringify(opts));
  }
  assert.equal(engine.checkTrainOptions({}).task, "reverse");
});

test("the same seed gives the same run, another seed another", () => {
  const run = (seed) => {
    const t = new engine.Trainer({ seed, d_model: 16, heads: 2, d_ff: 16, batch: 4 });
    return [t.step().loss, t.step().loss, t.step().batch.source.join("|"), t.tensors.get("tgt_embed.token.weight").data[5]];
  };
  assert.deepEqual(run(7), run(7));
  assert.notDeepEqual(run(7), run(8));
});

test("a step's batch: right-shifted inputs, the labels one ahead, a prediction for every position", () => {
  const t = new engine.Trainer({ task: "reverse", seed: 2, batch: 3, d_model: 16, heads: 2, d_ff: 16 });
  const { batch, step, loss } = t.step();
  assert.equal(step, 1);
  assert.ok(loss > 0 && Number.isFinite(loss));
  batch.source.forEach((source, k) => {
    assert.deepEqual(batch.targetOut[k], [...source.slice().reverse(), "</s>"]);
    assert.deepEqual(batch.targetIn[k], ["<s>", ...source.slice().reverse()]);
    assert.equal(batch.predicted[k].length, batch.targetIn[k].length);
  });
  assert.deepEqual(t.losses, [loss]);
});

test("the grammar moves the time word and gives each pronoun its role's form", () => {
  const t = new engine.Trainer({ task: "grammar", seed: 1, d_model: 16, heads: 2, d_ff: 16 });
  const pairs = [...t.heldOut, ...t.validationSet, ...t.trainPool].map(([s, e]) => [s.join(" "), e.join(" ")]);
  const english = new Map(pairs);
  assert.equal(english.get("他 昨天 看见 了 她"), "he saw her yesterday");
  assert.equal(english.get("昨天 她 看见 了 他"), "she saw him yesterday");
  assert.equal(english.get("我们 明天 会 帮助 他们"), "we will help them tomorrow");
  assert.equal(english.get("老师 昨天 叫 了 我"), "the teacher called me yesterday");
  const held = new Set(t.heldOut.map(([s]) => s.join(" "))), valid = new Set(t.validationSet.map(([s]) => s.join(" ")));
  assert.ok(held.size > 50 && valid.size > 50 && [...held].every((s) => !valid.has(s)));
  for (let i = 0; i < 300; i++) {
    const s = t.drawTraining()[0].join(" ");
    assert.ok(!held.has(s) && !valid.has(s), s);
  }
});

test("Adam's first step moves every weight with a gradient by about lr, against its gradient's sign", () => {
  const w = { shape: [3], data: Float64Array.from([1, 2, 3]) };
  const adam = new engine.Adam(new Map([["w", w]]));
  adam.step(new Map([[w, Float64Array.from([0.5, -2e-3, 0])]]), 0.1);
  assert.ok(Math.abs(w.data[0] - 0.9) < 1e-6 && Math.abs(w.data[1] - 2.1) < 1e-6 && w.data[2] === 3, String(w.data));
});

test("the warm-up rises linearly to lr, then stays or decays as 1/sqrt(step)", () => {
  const o = { lr: 0.01, warmup: 10, schedule: "constant" };
  assert.equal(engine.learningRate(o, 5), 0.005);
  assert.equal(engine.learningRate(o, 10), 0.01);
  assert.equal(engine.learningRate(o, 1000), 0.01);
  assert.ok(Math.abs(engine.learningRate({ ...o, schedule: "inverse-sqrt" }, 40) - 0.005) < 1e-15);
});

test("Gauss-Legendre nodes and weights integrate polynomials of degree 2n-1 exactly", () => {
  const { alphas, weights } = engine.gaussLegendre(2);
  assert.ok(Math.abs(alphas[0] - (1 - 1 / Math.sqrt(3)) / 2) < 1e-15 && Math.abs(weights[0] - 0.5) < 1e-15);
  for (const n of [1, 3, 8, 32]) {
    const rule = engine.gaussLegendre(n);
    const integral = rule.alphas.reduce((s, a, i) => s + rule.weights[i] * a ** (2 * n - 1), 0);
    assert.ok(Math.abs(integral - 1 / (2 * n)) < 1e-13, `n ${n}: ${integral}`);
    assert.ok(rule.alphas.every((a, i) => a > 0 && a < 1 && (i === 0 || a > rule.alphas[i - 1])));
  }
});

test("words of target pieces: a word starts at ▁, a special or punctuation", () => {
  assert.deepEqual(engine.wordGroups(["▁I", "▁ga", "ve", "▁him", ".", "</s>"]), [[0], [1, 2], [3], [4], [5]]);
  assert.deepEqual(engine.wordGroups(["▁", "F", "ine", "▁", ".", "</s>"]), [[0, 1, 2], [3, 4], [5]]);   // bare ▁
  assert.deepEqual(engine.wordGroups(["▁", "</s>"]), [[0], [1]]);
});

test("central differences agree with the backward on a fresh pre-norm model with RoPE", () => {
  const t = new engine.Trainer({ seed: 5, d_model: 8, heads: 2, d_ff: 8, norm_placement: "pre", positions: "rope" });
  const src = [4, 5, 6, 7], tgtIn = [1, 7, 6], labels = [7, 6, 2];
  const g = engine.gradients(t.model, src, tgtIn, { labels, smoothing: 0.1 });
  const loss = () => {
    const logits = engine.matrix(3, t.config.tgt_vocab);
    t.model.forward(src, tgtIn).logits.forEach((row, i) => logits.data.set(row, i * logits.cols));
    return engine.labelSmoothedLoss(logits, labels, 0.1, 0).value;
  };
  let checked = 0;
  for (const [name, tensor] of t.tensors) {
    for (const i of [0, Math.floor(tensor.data.length / 2)]) {
      const saved = tensor.data[i], h = 1e-5;
      tensor.data[i] = saved + h;
      const up = loss();
      tensor.data[i] = saved - h;
      const down = loss();
      tensor.data[i] = saved;
      const analytic = g.params.get(name)[i];
      assert.ok(Math.abs((up - down) / (2 * h) - analytic) < 1e-7 * Math.max(1, Math.abs(analytic)), `${name}[${i}]`);
      checked++;
    }
  }
  assert.ok(checked > 30);
});

test("attribution on a toy: completeness within the tolerance at auto, bad options named", () => {
  const t = new engine.Trainer({ task: "reverse", seed: 4, d_model: 16, heads: 2, d_ff: 16, batch: 8 });
  for (let i = 0; i < 20; i++) t.step();
  const pair = t.encodePair(t.heldOut[0]);
  const sentence = { srcIds: pair.src, tgtInIds: pair.tgtIn, targetIds: pair.labels, sourceUnits: t.heldOut[0][0],
    targetTokens: pair.labels.map((id) => `▁${t.vocab.target[id]}`) };
  const report = engine.attributeReport(t.model, sentence, { tolerance: 0.001 });
  assert.equal(report.rows.length, pair.labels.length);
  for (const row of report.rows) {
    assert.ok(row.error <= 0.001 || report.integration.unconverged.includes(row.token), JSON.stringify(row));
    assert.ok(Math.abs(row.sum - row.delta) <= 0.001 * Math.max(Math.abs(row.delta), 0.01) || row.error > 0.001);
    assert.equal(row.prefix.length, row.position + 1);
  }
  assert.ok(report.rows.some((row) => row.steps > 16));                  // the doubling ran
  const bad = [
    [{ method: "integrated-gradients", steps: 300 }, "steps", /MAX_IG_STEPS/],
    [{ tolerance: 2 }, "tolerance", /between 0 and 1/],
    [{ rule: "simpson" }, "rule", /trapezoid, gauss-legendre/],
    [{ method: "gradient" }, "method", /saliency/],
  ];
  for (const [opts, field, message] of bad) {
    assert.throws(() => engine.attributeReport(t.model, sentence, opts), (e) => e.field === field && message.test(e.message),
      JSON.stringify(opts));
  }
  assert.throws(() => engine.attributeReport(t.model, { ...sentence, contrast: "a", contrastToken: 4 }, { method: "attention" }),
    (e) => e.field === "contrast");
  // MAX_ATTRIBUTION_POSITIONS, as attribution.py: passes × (source + target positions); auto's budget shrinks with it
  const limits = engine.ATTRIBUTION_LIMITS, saved = limits.MAX_ATTRIBUTION_POSITIONS;
  const rows = pair.labels.length, positions = pair.src.length + pair.tgtIn.length, first = rows * 17;
  try {
    limits.MAX_ATTRIBUTION_POSITIONS = first * positions - 1;
    assert.throws(() => engine.attributeReport(t.model, sentence, {}),
      (e) => e.field === "steps" && e.message.includes(`× ${positions} positions`) && /MAX_ATTRIBUTION_POSITIONS/.test(e.message));
    limits.MAX_ATTRIBUTION_POSITIONS = (first + 10) * positions;
    const capped = engine.attributeReport(t.model, sentence, { tolerance: 1e-9 });
    const passes = capped.rows.reduce((total, row) => total + row.passes, 0);
    assert.ok(passes >= first && passes <= first + 10, String(passes));
    assert.ok(capped.integration.unconverged.length > 0);
  } finally {
    limits.MAX_ATTRIBUTION_POSITIONS = saved;
  }
});

test("integrated gradients at one trapezoid step: half the gradient at the baseline, half at the input", () => {
  const t = new engine.Trainer({ task: "copy", seed: 6, d_model: 16, heads: 2, d_ff: 16, batch: 8 });
  for (let i = 0; i < 10; i++) t.step();
  const { src, tgtIn, labels } = t.encodePair(t.heldOut[1]);
  const row = 2, token = labels[row], d = t.config.d_model;
  const out = engine.attribution(t.model, src, tgtIn, [row], [token], { method: "integrated-gradients", steps: 1 });
  const { probes } = t.model.forward(src, tgtIn, { record: ["encoder.embedding", "decoder.embedding"] });
  const x = [probes.get("encoder.embedding"), probes.get("decoder.embedding")];
  const b = x.map((m) => engine.matrix(m.rows, d, t.model.sinusoidal.data.slice(0, m.rows * d)));   // position-only
  const at = (e) => engine.gradients(t.model, src, tgtIn, { row, token }, { embeddings: { src: e[0], tgt: e[1] }, weights: false });
  const g0 = at(b), g1 = at(x);
  [[0, "srcEmbedding", out.source[0]], [1, "tgtEmbedding", out.prefix[0]]].forEach(([k, name, scores]) => {
    for (let i = 0; i < x[k].rows; i++) {
      let s = 0;
      for (let c = 0; c < d; c++) {
        const at = i * d + c;
        s += (x[k].data[at] - b[k].data[at]) * (0.5 * g0[name].data[at] + 0.5 * g1[name].data[at]);
      }
      assert.ok(Math.abs(s - scores[i]) <= 1e-12 * Math.max(1, Math.abs(s)), `${name}[${i}]: ${scores[i]} vs ${s}`);
    }
  });
  assert.ok(out.prefix[0].slice(row + 1).every((v) => v === 0));          // inputs after the row: exactly 0
});

test("held-out and validation sets that would leave too little to train on are refused", () => {
  assert.throws(() => new engine.Trainer({ task: "copy", symbols: 2, min_length: 3, max_length: 4, held_out: 10, validation: 10 }),
    (e) => e.field === "held_out" && /24 distinct sequences/.test(e.message));
  assert.ok(new engine.Trainer({ task: "copy", symbols: 2, min_length: 5, max_length: 6, held_out: 20, validation: 20, d_model: 8, heads: 2, d_ff: 8 }));
});

test("the example shown is the first held-out pair of the greatest length", () => {
  const t = new engine.Trainer({ seed: 3, d_model: 16, heads: 2, d_ff: 16, batch: 4, min_length: 3, max_length: 7 });
  const longest = Math.max(...t.heldOut.map(([source]) => source.length));
  assert.equal(longest, 7);
  assert.equal(t.shown, t.heldOut.findIndex(([source]) => source.length === 7));
  const ex = t.example();
  assert.deepEqual(ex.source, t.heldOut[t.shown][0]);
  assert.equal(ex.cross_attention.length, ex.target.length);
  assert.ok(ex.cross_attention.every((row) => row.length === ex.source.length));
});
