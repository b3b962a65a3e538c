// The engine's pure-JS tests: `node --test tests/engine/`. The model tests read the bundle named by
// GLASSFORMER_ENGINE_BUNDLE (tests/test_engine.py writes one from a trained tiny model) and skip without it.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import * as engine from "../../src/glassformer/lab/static/engine/index.js";
import { decodeBase64, halfToNumber } from "../../src/glassformer/lab/static/engine/weights.js";

const SIX = 5e-7;   // a number printed to six decimals is within this of the exact one

function close(actual, expected, tol, what) {
  assert.equal(actual.length, expected.length, what);
  actual.forEach((a, i) => assert.ok(Math.abs(a - expected[i]) <= tol, `${what}[${i}]: ${a} vs ${expected[i]}`));
}

test("the BLOCK gives the lesson's printed numbers (row 1, six decimals)", () => {
  const r = engine.runTrace(engine.blockSpec());
  close(r.self_attention.heads[0].output[0], [0.401112, 0.796664], SIX, "head 1");
  close(r.self_attention.heads[1].output[0], [0.598888, 0.802224], SIX, "head 2");
  close(r.self_attention.output[0], [1.0, 1.598888, -0.197776, -0.00556], SIX, "MHA");
  close(r.sublayers[0].residual[0], [2.0, 1.598888, 0.802224, -0.00556], SIX, "x + MHA");
  close(r.sublayers[0].normed[0], [1.170705, 0.649589, -0.385419, -1.434875], SIX, "LN 1");
  close(r.ffn.hidden[0], [1.170705, 0.649589, 0, 0, 0.521116, 0], SIX, "FFN hidden");
  close(r.ffn.output[0], [0.585353, 0.324795, 0.130279, 0], SIX, "FFN");
  close(r.output[0], [1.233154, 0.588798, -0.424732, -1.39722], SIX, "LN 2");
});

test("the 2x3 exercise: unscaled weights and outputs as printed, 1/sqrt(2) when scaled", () => {
  const r = engine.runTrace(engine.exerciseSpec());
  close(r.weights[0], [0.422319, 0.155362, 0.422319], SIX, "weights 0");
  close(r.weights[1], [0.155362, 0.422319, 0.422319], SIX, "weights 1");
  close(r.output[0], [1.266956, 1.466087], SIX, "output 0");
  close(r.output[1], [0.733044, 2.533913], SIX, "output 1");
  const scaled = engine.runTrace(engine.exerciseSpec(true));
  assert.ok(Math.abs(scaled.scaled_scores[0][0] - 0.707107) <= SIX);
  assert.deepEqual(engine.round6(r.output), [[1.266956, 1.466087], [0.733044, 2.533913]]);
});

test("a switched-off head shows its own output but gives zeros to the concat", () => {
  const r = engine.runTrace({ ...engine.blockSpec(), disabled_heads: [1] });
  assert.equal(r.self_attention.heads[1].disabled, true);
  assert.ok(r.self_attention.heads[1].output[0].some((v) => v !== 0));
  assert.deepEqual(r.self_attention.concat.map((row) => row.slice(2)), [[0, 0], [0, 0], [0, 0]]);
});

test("masks: causal rows see no later key (null scores), a row with no key gets zeros", () => {
  const r = engine.runTrace({ ...engine.exerciseSpec(true), k: [[1, 0], [0, 1]], v: [[2, 0], [0, 4]], mask: "causal" });
  assert.equal(r.scaled_scores[0][1], null);
  assert.deepEqual(r.weights[0], [1, 0]);
  const empty = engine.softmaxRows([[1, 2], [3, 4]], [[false, false], [true, true]]);
  assert.deepEqual(empty[0], [0, 0]);
  close([empty[1].reduce((a, b) => a + b)], [1], 1e-15, "row sum");
  assert.deepEqual(engine.causalMask(2, 3, 1).data, Float64Array.from([1, 1, 0, 1, 1, 1]));
});

test("primitives: matmul, transpose, layerNorm", () => {
  assert.deepEqual(engine.matmul([[1, 2], [3, 4]], [[5], [6]]), [[17], [39]]);
  assert.deepEqual(engine.transpose([[1, 2, 3]]), [[1], [2], [3]]);
  const y = engine.layerNorm([[1, 2, 3, 6]], [1, 1, 1, 1], [0, 0, 0, 0], 0)[0];
  close([y.reduce((a, b) => a + b) / 4, y.reduce((a, b) => a + b * b, 0) / 4], [0, 1], 1e-12, "mean, var");
});

test("a bad trace document is one line naming its field", () => {
  assert.throws(() => engine.runTrace({ ...engine.blockSpec(), norm: "middle" }), /^Error: norm: /);
  assert.throws(() => engine.runTrace({ ...engine.exerciseSpec(), v: [[1, 2]] }), /^Error: v: expected 3×\?/);
  assert.throws(() => engine.runTrace({ ...engine.exerciseSpec(), q: [[1, NaN]] }), /q\[0\]\[1\]: expected a finite number/);
});

test("base64 and float16 decoding", () => {
  const bytes = Uint8Array.from({ length: 257 }, (_, i) => (i * 37) % 256);
  assert.deepEqual(decodeBase64(Buffer.from(bytes).toString("base64")), bytes);
  assert.equal(halfToNumber(0x3c00), 1);
  assert.equal(halfToNumber(0xc000), -2);
  assert.equal(halfToNumber(0x7bff), 65504);
  assert.equal(halfToNumber(0x0001), 2 ** -24);
  assert.throws(() => decodeBase64("ab$d"), /model bundle: .*base64/);
});

function handBundle(values, shape) {
  const raw = Buffer.from(Float32Array.from(values).buffer);
  return { format: "glassformer-bundle/1", config: {}, vocab: { source: {}, target: {} }, dtype: "float32",
    tensors: { w: { shape, offset: 0, length: raw.length } }, data: raw.toString("base64") };
}

test("loadBundle reads float32 exactly and refuses a damaged bundle in one line", () => {
  const out = engine.loadBundle(handBundle([1.5, -2, 0.25, 3], [2, 2]));
  assert.deepEqual(out.tensors.get("w"), { shape: [2, 2], data: Float64Array.from([1.5, -2, 0.25, 3]) });
  const bad = handBundle([1, 2, 3, 4], [2, 3]);
  assert.throws(() => engine.loadBundle(bad), /^Error: model bundle: tensor w: bytes 0\.\.16 of shape \[2,3\]/);
  assert.throws(() => engine.loadBundle({ ...bad, format: "x" }), /model bundle: format/);
  assert.throws(() => engine.loadBundle("not json"), /model bundle: expected a JSON object/);
});

// ---- the trained bundle, when the Python test wrote one ---------------------------------------------------

const BUNDLE = process.env.GLASSFORMER_ENGINE_BUNDLE;
const needs = { skip: BUNDLE ? false : "GLASSFORMER_ENGINE_BUNDLE not set (tests/test_engine.py sets it)" };
let cached = null;
function model() {
  if (!cached) {
    const loaded = engine.loadBundle(JSON.parse(readFileSync(BUNDLE, "utf8")));
    cached = new engine.Transformer(loaded.config, loaded.tensors);
  }
  return cached;
}

test("every decoding step equals the whole pass's row (the KV cache)", needs, () => {
  const m = model(), src = [5, 6, 7, 8, 9], tgt = [1, 4, 5, 6, 7, 8];
  const whole = m.forward(src, tgt).logits;
  const encoded = m.encode(src), cache = m.newCache();
  tgt.forEach((id, t) => {
    const step = m.decodeStep(id, encoded, cache).logits;
    step.forEach((v, i) => assert.ok(Math.abs(v - whole[t][i]) <= 1e-10 * (1 + Math.abs(v)), `row ${t} id ${i}`));
  });
  const copy = cache.clone();                                            // a clone does not move with its source
  m.decodeStep(9, encoded, cache);
  assert.equal(copy.length, tgt.length);
  assert.equal(cache.length, tgt.length + 1);
});

test("every cross-attention head off: the target rows no longer depend on the source", needs, () => {
  const m = model(), cfg = m.config;
  const off = [];
  for (let i = 0; i < cfg.decoder_layers; i++) for (let h = 0; h < cfg.heads; h++) off.push(`decoder.${i}.cross_attention.head.${h}`);
  const a = m.forward([5, 6, 7], [1, 4, 5], { off }).logits, b = m.forward([9, 8, 7, 6], [1, 4, 5], { off }).logits;
  assert.deepEqual(a, b);
  assert.notDeepEqual(m.forward([5, 6, 7], [1, 4, 5]).logits, m.forward([9, 8, 7, 6], [1, 4, 5]).logits);
  assert.throws(() => m.forward([5], [1], { off: ["decoder.9.cross_attention.head.0"] }), /off: no head/);
  assert.throws(() => m.forward([5], [1], { intervene: { "decoder.*.nothing": (v) => v } }), /intervene: no probe matches/);
});

test("patching: every head or every position patched restores the clean run; nothing restores nothing", needs, () => {
  const m = model();
  const steps = [];
  const table = engine.patchingTable(m, [5, 6, 7, 8], [5, 6, 9, 8], [1, 4, 5, 6], 2, 7, { onProgress: (s) => steps.push(s) });
  assert.ok(Math.abs(table.all_heads.fraction - 1) < 1e-9);
  assert.ok(table.nothing.fraction === 0);                                 // (0 or -0)
  table.all_positions.forEach((cell) => assert.ok(Math.abs(cell.fraction - 1) < 1e-9));
  assert.ok(table.positions[0][0].fraction === 0);                       // the embedding where the sentences agree
  assert.equal(steps.at(-1).done, steps.at(-1).total);
  assert.equal(table.heads.length, m.config.decoder_layers);
});

test("the logit lens ends at the model's own probability; ALTI+ rows are shares", needs, () => {
  const m = model(), src = [5, 6, 7, 8], tgt = [1, 4, 5, 6];
  const lens = engine.logitLens(m, src, tgt, 2, 7, 9);
  assert.ok(Math.abs(lens.steps.at(-1).p - lens.p_model) < 1e-12);
  const alti = engine.altiPlus(m, src, tgt);
  assert.equal(alti.cols, src.length + tgt.length);
  for (let t = 0; t < alti.rows; t++) {
    const row = alti.data.subarray(t * alti.cols, (t + 1) * alti.cols);
    assert.ok(Math.abs(row.reduce((a, b) => a + b) - 1) < 1e-12 && row.every((v) => v >= 0));
    row.slice(src.length + t + 1).forEach((v) => assert.equal(v, 0));      // no share from a later target input
  }
});

test("search: within the output limit, beam 1 is greedy, the distribution sums to 1", needs, () => {
  const m = model(), src = [5, 6, 7, 8];
  assert.ok(engine.greedy(m, src, { maxLen: 3 }).length <= 3);
  assert.ok(engine.greedy(m, src).length <= engine.outputLimit(src.length, m.config.max_len) - 0);
  assert.deepEqual(engine.beamSearch(m, src, { beam: 1 }), engine.greedy(m, src));
  const all = engine.nextDistribution(m, src, [4], { top: Infinity });
  assert.equal(all.length, m.config.tgt_vocab);
  assert.ok(Math.abs(all.reduce((a, e) => a + e.p, 0) - 1) < 1e-12);
  assert.ok(all.every((e, i) => i === 0 || all[i - 1].p >= e.p));
});
