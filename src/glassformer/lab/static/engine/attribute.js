// Why *him*, computed in the page: gradient attribution with the engine's backward pass, the numbers of
// glassformer/interpret/attribution.py, integrated.py, attribution_patching.py and why.py (`glassformer
// attribute --json`).
//
// For target row t (teacher-forced), f_t = log p(y_t | source, y_<t), or with a contrast word c
// f_t = log p(y_t | ...) - log p(c | ...). e is the value at encoder.embedding / decoder.embedding (token x sqrt(d)
// + position); one score per source unit and per target input 0..t:
//   saliency            sum_d |df/de|
//   input-x-gradient    sum_d e * df/de
//   integrated-gradients sum_d (e - e') * integral_0^1 df/de(e' + a (e - e')) da, the integral by a quadrature
//                       rule (trapezoid, or Gauss-Legendre) from the baseline e' (position-only: each position's
//                       sinusoidal vector; PAD's embedding for models without a sinusoidal table). Completeness:
//                       a row's scores sum to f(e) - f(e') (delta); error = |sum - delta| / max(|delta|, 0.01);
//                       steps "auto" doubles the steps from 16 until every word is within the tolerance.
// One forward pass per node serves every row: each row's objective is a separate backward over the same tape.

import { matrix, tapedPass, logProbObjective, logSoftmaxRow } from "./model.js";
import { softmaxRow, patchSites, checkPatchArguments, FLAT, altiPlus } from "./interpret.js";
import { generate } from "./search.js";

export const ATTRIBUTION_METHODS = ["saliency", "input-x-gradient", "integrated-gradients", "attention", "alti"];
export const GRADIENT_METHODS = ATTRIBUTION_METHODS.slice(0, 3);
export const DEFAULT_ATTRIBUTION_METHOD = "integrated-gradients";
export const AUTO_STEPS = "auto";               // steps: doubled until every row is complete within the tolerance
export const QUADRATURE_RULES = ["trapezoid", "gauss-legendre"];
export const DEFAULT_RULE = "trapezoid";
export const DEFAULT_TOLERANCE = 0.01;          // 1 %
export const DELTA_FLOOR = 1e-2;                // nats: below this |delta| the error is absolute
export const START_STEPS = 16;                  // auto: the first steps, doubled from there
// glassformer.limits: MAX_IG_STEPS, MAX_ATTRIBUTION_PASSES, MAX_ATTRIBUTION_POSITIONS, MAX_IG_AUTO_STEPS
export const ATTRIBUTION_LIMITS = { MAX_IG_STEPS: 256, MAX_ATTRIBUTION_PASSES: 8192, MAX_ATTRIBUTION_POSITIONS: 1048576,
  MAX_IG_AUTO_STEPS: 1024 };

function usage(field, message) {
  const error = new Error(`${field}: ${message}`);
  error.field = field;
  return error;
}

// ---- checks (attribution.py check_steps / check_passes, integrated.py check_rule / check_tolerance) ------

export function checkSteps(steps, field = "steps") {
  if (steps === AUTO_STEPS) return;
  if (!Number.isInteger(steps)) throw usage(field, `expected an integer number of steps or 'auto', got ${JSON.stringify(steps)}`);
  if (steps < 1) throw usage(field, `expected at least 1 step, got ${steps}`);
  if (steps > ATTRIBUTION_LIMITS.MAX_IG_STEPS) {
    throw usage(field, `integrated-gradients steps is ${steps}; the limit is ${ATTRIBUTION_LIMITS.MAX_IG_STEPS} (MAX_IG_STEPS)`);
  }
}

function checkRule(rule) {
  if (!QUADRATURE_RULES.includes(rule)) throw usage("rule", `expected one of ${QUADRATURE_RULES.join(", ")}, got ${JSON.stringify(rule)}`);
}

function checkTolerance(tolerance) {
  if (typeof tolerance !== "number" || !Number.isFinite(tolerance) || !(tolerance > 0 && tolerance < 1)) {
    throw usage("tolerance", `expected a number between 0 and 1 (0.01 = 1 %), got ${JSON.stringify(tolerance)}`);
  }
}

function passesPerRow(rule, steps) {
  return rule === "trapezoid" ? steps + 1 : steps;
}

// attribution.py `check_passes`: rows × the passes of a row (auto: its first count), and times the sentence's
// positions (source + target), within the limits
function checkPasses(rows, steps, rule, positions) {
  const first = steps === AUTO_STEPS ? START_STEPS : steps;
  const passes = rows * passesPerRow(rule, first);
  if (passes > ATTRIBUTION_LIMITS.MAX_ATTRIBUTION_PASSES) {
    throw usage("steps", `rows × integrated-gradients passes is ${passes.toLocaleString("en-US")}; the limit is ` +
                `${ATTRIBUTION_LIMITS.MAX_ATTRIBUTION_PASSES.toLocaleString("en-US")} (MAX_ATTRIBUTION_PASSES)`);
  }
  if (passes * positions > ATTRIBUTION_LIMITS.MAX_ATTRIBUTION_POSITIONS) {
    throw usage("steps", `rows × integrated-gradients passes × ${positions} positions is ` +
                `${(passes * positions).toLocaleString("en-US")}; the limit is ` +
                `${ATTRIBUTION_LIMITS.MAX_ATTRIBUTION_POSITIONS.toLocaleString("en-US")} (MAX_ATTRIBUTION_POSITIONS)`);
  }
}

// attribution.py `pass_budget`: the passes auto may run on a sentence of `positions` (fewer for a long one)
export function passBudget(positions) {
  return Math.min(ATTRIBUTION_LIMITS.MAX_ATTRIBUTION_PASSES,
    Math.floor(ATTRIBUTION_LIMITS.MAX_ATTRIBUTION_POSITIONS / Math.max(positions, 1)));
}

// ---- quadrature rules (integrated.py) -------------------------------------------------------------------

// trapezoid on `steps` equal intervals: nodes a = i / steps for i in `nodes`, weights 1/steps (ends halved)
function trapezoid(nodes, steps) {
  return { alphas: nodes.map((i) => i / steps), weights: nodes.map((i) => (i === 0 || i === steps ? 0.5 : 1) / steps) };
}

// Gauss-Legendre: the roots of P_n on (-1, 1) by Newton's method, weights 2 / ((1 - x^2) P_n'(x)^2), moved to (0, 1)
export function gaussLegendre(n) {
  const alphas = new Array(n), weights = new Array(n);
  for (let i = 0; i < n; i++) {
    let x = Math.cos((Math.PI * (i + 0.75)) / (n + 0.5)), dp = 0;
    for (let iteration = 0; iteration < 100; iteration++) {
      let p0 = 1, p1 = x;                                                // P_0, P_1; recurrence to P_n
      for (let k = 2; k <= n; k++) [p0, p1] = [p1, ((2 * k - 1) * x * p1 - (k - 1) * p0) / k];
      const pn = n === 1 ? x : p1, pPrev = n === 1 ? 1 : p0;
      dp = (n * (x * pn - pPrev)) / (x * x - 1);
      const step = pn / dp;
      x -= step;
      if (Math.abs(step) < 1e-16) break;
    }
    const w = 2 / ((1 - x * x) * dp * dp);
    alphas[n - 1 - i] = (x + 1) / 2;                                    // ascending in (0, 1)
    weights[n - 1 - i] = w / 2;
  }
  return { alphas, weights };
}

function ruleNodes(rule, steps) {
  if (rule === "gauss-legendre") return gaussLegendre(steps);
  return trapezoid(Array.from({ length: steps + 1 }, (_, i) => i), steps);
}

function rowErrors(total, delta) {
  return total.map((t, i) => Math.abs(t - delta[i]) / Math.max(Math.abs(delta[i]), DELTA_FLOOR));
}

// each row's error as the error of its group (a word: the sums of its pieces' rows)
function groupedErrors(source, prefix, delta, group) {
  const k = Math.max(...group) + 1, total = new Array(k).fill(0), gap = new Array(k).fill(0);
  group.forEach((g, r) => {
    total[g] += sum(source[r]) + sum(prefix[r]);
    gap[g] += delta[r];
  });
  const errors = rowErrors(total, gap);
  return group.map((g) => errors[g]);
}

function sum(values) {
  let s = 0;
  for (const v of values) s += v;
  return s;
}

// ---- the path -----------------------------------------------------------------------------------------

// e' at both hook points: position-only (the sinusoidal rows) or the PAD token's embedding at every position
export function baselineName(model) {
  return model.config.positions === "sinusoidal" ? "position-only" : "pad-token";
}

function baselineEmbeddings(model, S, T) {
  const d = model.config.d_model;
  if (baselineName(model) === "position-only") {
    const rows = (n) => matrix(n, d, model.sinusoidal.data.slice(0, n * d));
    return [rows(S), rows(T)];
  }
  const pad = model.config.pad_id;
  return [model.embed(new Array(S).fill(pad), model.srcToken, model.srcLearned, 0),
    model.embed(new Array(T).fill(pad), model.tgtToken, model.tgtLearned, 0)];
}

// the values at the two embedding hook points of a plain pass
function inputEmbeddings(model, srcIds, tgtInIds, off) {
  const { probes } = model.forward(srcIds, tgtInIds, { record: ["encoder.embedding", "decoder.embedding"], off });
  return [probes.get("encoder.embedding"), probes.get("decoder.embedding")];
}

function along(b, x, alpha) {                                           // e' + a (e - e')
  const out = matrix(x.rows, x.cols);
  for (let i = 0; i < out.data.length; i++) out.data[i] = b.data[i] + alpha * (x.data[i] - b.data[i]);
  return out;
}

// f of every row at given embeddings (one forward pass)
function values(model, path, embeddings) {
  const { logits } = model.forward(path.srcIds, path.tgtInIds, { off: path.off, intervene: {
    "encoder.embedding": () => embeddings[0], "decoder.embedding": () => embeddings[1] } });
  return path.rows.map((row, r) => {
    const logp = logSoftmaxRow(matrix(1, logits[row].length, logits[row]), 0);
    const c = path.contrast[r];
    return c >= 0 ? logp[path.tokens[r]] - logp[c] : logp[path.tokens[r]];
  });
}

// Scores of rows `which` at nodes `alphas`: out.src[r][k] (S,), out.tgt[r][k] (T,), and out.f[r][k] the row's f
// at the node. kind "dot": sum_d (e - e') * df/de at e' + a (e - e'); "abs": sum_d |df/de|. A generator: yields
// after each backward.
function* nodeScores(model, path, which, alphas, kind, progress) {
  const [xs, xt] = path.x, [bs, bt] = path.b;
  const S = xs.rows, T = xt.rows, d = xs.cols;
  const out = { src: which.map(() => []), tgt: which.map(() => []), f: which.map(() => []) };
  for (let k = 0; k < alphas.length; k++) {
    const pass = tapedPass(model, path.srcIds, path.tgtInIds, {
      embeddings: { src: along(bs, xs, alphas[k]), tgt: along(bt, xt, alphas[k]) }, weights: false, off: path.off });
    for (let n = 0; n < which.length; n++) {
      const r = which[n];
      const objective = logProbObjective(pass.logits, path.rows[r], path.tokens[r], path.contrast[r]);
      out.f[n].push(objective.value);
      pass.backward(objective.grad);
      const gs = pass.tape.gradIf(pass.srcEmbedding), gt = pass.tape.gradIf(pass.tgtEmbedding);
      const score = (g, x, b, rows) => {
        const s = new Float64Array(rows);
        if (!g) return s;
        for (let i = 0; i < rows; i++) {
          let total = 0;
          for (let c = 0; c < d; c++) {
            const at = i * d + c;
            total += kind === "abs" ? Math.abs(g[at]) : (x.data[at] - b.data[at]) * g[at];
          }
          s[i] = total;
        }
        return s;
      };
      out.src[n].push(score(gs, xs, bs, S));
      out.tgt[n].push(score(gt, xt, bt, T));
      progress.done++;
      yield { done: progress.done, total: progress.total };
    }
  }
  return out;
}

// sum_k w_k s[k] for each row
function weighted(scores, weights) {
  return scores.map((perNode) => {
    const out = new Float64Array(perNode[0].length);
    perNode.forEach((s, k) => { for (let i = 0; i < s.length; i++) out[i] += weights[k] * s[i]; });
    return out;
  });
}

// ---- one sentence's rows ----------------------------------------------------------------------------------

// Scores for target rows `rows` (0-based rows of tgtInIds) predicting `tokens`. A generator: yields {done, total}
// after each forward-backward pass, returns {method, source: Float64Array (S,)[], prefix: Float64Array (T,)[],
// value, baseline, error, steps, passes (per row; the last four: integrated gradients only)}.
// opts: method, steps (a number or "auto"), contrast (an id for every row, or per row: < 0 none), rule,
// tolerance, group (auto: the word of each row, which converges as one), off (heads switched off).
export function* attributionRows(model, srcIds, tgtInIds, rows, tokens, opts = {}) {
  const { method = DEFAULT_ATTRIBUTION_METHOD, steps = AUTO_STEPS, rule = DEFAULT_RULE, tolerance = DEFAULT_TOLERANCE,
    off = [] } = opts;
  if (!GRADIENT_METHODS.includes(method)) throw usage("method", `expected one of ${GRADIENT_METHODS.join(", ")}, got ${JSON.stringify(method)}`);
  if (rows.some((r) => !(Number.isInteger(r) && r >= 0 && r < tgtInIds.length))) {
    throw usage("row", `outside the target input of ${tgtInIds.length} positions`);
  }
  checkRule(rule);
  checkTolerance(tolerance);
  const contrast = Array.isArray(opts.contrast) ? opts.contrast
    : rows.map(() => (opts.contrast === null || opts.contrast === undefined ? -1 : opts.contrast));
  const path = { srcIds, tgtInIds, rows, tokens, contrast, off, x: inputEmbeddings(model, srcIds, tgtInIds, off) };
  const every = rows.map((_, r) => r);
  if (method !== "integrated-gradients") {                            // one pass at e (e' = 0, a = 1): f there too
    path.b = [matrix(path.x[0].rows, path.x[0].cols), matrix(path.x[1].rows, path.x[1].cols)];
    const progress = { done: 0, total: rows.length };
    const s = yield* nodeScores(model, path, every, [1], method === "saliency" ? "abs" : "dot", progress);
    return { method, source: s.src.map((x) => x[0]), prefix: s.tgt.map((x) => x[0]), value: s.f.map((x) => x[0]),
      baseline: null, error: null, steps: null, passes: null };
  }
  checkSteps(steps);
  checkPasses(rows.length, steps, rule, srcIds.length + tgtInIds.length);
  path.b = baselineEmbeddings(model, srcIds.length, tgtInIds.length);
  const value = values(model, path, path.x), baseline = values(model, path, path.b);
  const delta = value.map((v, r) => v - baseline[r]);
  const out = steps === AUTO_STEPS
    ? yield* autoSteps(model, path, delta, rule, tolerance, opts.group)
    : yield* fixedSteps(model, path, steps, rule);
  const error = rowErrors(out.source.map((s, r) => sum(s) + sum(out.prefix[r])), delta);
  return { method, ...out, value, baseline, error };
}

function* fixedSteps(model, path, steps, rule) {
  const { alphas, weights } = ruleNodes(rule, steps);
  const every = path.rows.map((_, r) => r);
  const progress = { done: 0, total: every.length * alphas.length };
  const s = yield* nodeScores(model, path, every, alphas, "dot", progress);
  return { source: weighted(s.src, weights), prefix: weighted(s.tgt, weights), steps: every.map(() => steps),
    passes: every.map(() => alphas.length) };
}

// integrated.py `auto`: double the steps from START_STEPS until every row (group) is within `tolerance`, or
// until the next count would pass MAX_IG_AUTO_STEPS or the pass budget; the trapezoid's doubled grid reuses
// every earlier node (T_n = T_(n/2) / 2 + the new midpoints); a row that converged is not run again.
function* autoSteps(model, path, delta, rule, tolerance, group) {
  const rows = path.rows.length, S = path.x[0].rows, T = path.x[1].rows;
  group = group || path.rows.map((_, r) => r);
  const budget = passBudget(S + T);
  const source = Array.from({ length: rows }, () => new Float64Array(S));
  const prefix = Array.from({ length: rows }, () => new Float64Array(T));
  const steps = new Array(rows).fill(0), passes = new Array(rows).fill(0);
  let open = path.rows.map((_, r) => r), n = START_STEPS, spent = 0;
  const progress = { done: 0, total: rows * (passesPerRow(rule, n)) };
  while (open.length && n <= ATTRIBUTION_LIMITS.MAX_IG_AUTO_STEPS) {
    const nested = rule === "trapezoid" && spent > 0;                   // reuse the n/2 grid: run odd i only
    const fresh = [];
    for (let i = nested ? 1 : rule === "trapezoid" ? 0 : 1; i <= n; i += nested ? 2 : 1) fresh.push(i);
    if (spent && spent + open.length * fresh.length > budget) break;
    const { alphas, weights } = rule === "trapezoid" ? trapezoid(fresh, n) : gaussLegendre(n);
    progress.total = progress.done + open.length * alphas.length;
    const s = yield* nodeScores(model, path, open, alphas, "dot", progress);
    const addSrc = weighted(s.src, weights), addTgt = weighted(s.tgt, weights);
    const keep = nested ? 0.5 : 0.0;
    open.forEach((r, k) => {
      for (let i = 0; i < S; i++) source[r][i] = keep * source[r][i] + addSrc[k][i];
      for (let i = 0; i < T; i++) prefix[r][i] = keep * prefix[r][i] + addTgt[k][i];
      steps[r] = n;
      passes[r] += fresh.length;
    });
    spent += open.length * fresh.length;
    const err = groupedErrors(source, prefix, delta, group);
    open = open.filter((r) => err[r] > tolerance);
    n *= 2;
  }
  return { source, prefix, steps, passes };
}

// Cross- and self-attention weights of each row, averaged over every decoder layer and head
function attentionRows(model, srcIds, tgtInIds, rows) {
  const { probes } = model.forward(srcIds, tgtInIds, { record: ["decoder.*.cross_attention.head.*.weights",
    "decoder.*.self_attention.head.*.weights"] });
  const mean = (part) => {
    const names = [...probes.keys()].filter((name) => name.includes(`.${part}.`));
    const first = probes.get(names[0]), total = new Float64Array(first.data.length);
    for (const name of names) probes.get(name).data.forEach((v, i) => { total[i] += v; });
    return rows.map((r) => total.slice(r * first.cols, (r + 1) * first.cols).map((v) => v / names.length));
  };
  return { source: mean("cross_attention"), prefix: mean("self_attention") };
}

// ---- `glassformer attribute --json` (interpret/why.py) ------------------------------------------------------

function isPunctuationPiece(piece) {                                   // why.py _punct: no letter or digit
  const text = piece.split("▁").join("");
  return text.length > 0 && !/[\p{L}\p{N}]/u.test(text);
}

// indices of `pieces` grouped into words: a word starts at a ▁ piece, a special, or punctuation; a bare ▁ (the
// space SentencePiece cuts off before punctuation) belongs to the piece after it
export function wordGroups(pieces) {
  const groups = [];
  pieces.forEach((piece, k) => {
    const special = piece.startsWith("<") && piece.endsWith(">");
    const starts = (groups.length === 0 || piece.startsWith("▁") || special || isPunctuationPiece(piece) ||
      isPunctuationPiece(pieces[k - 1]) || pieces[k - 1].startsWith("<")) &&
      !(k > 0 && pieces[k - 1] === "▁" && !special);
    if (starts) groups.push([k]);
    else groups[groups.length - 1].push(k);
  });
  return groups;
}

// Source-share of one row: gradient methods sum|source| / (sum|source| + sum|prefix|); alti sum source
function sourceShare(source, prefix, method) {
  if (method === "alti") return Math.min(1, Math.max(0, sum(source)));
  if (method === "attention") return null;
  const s = sum(Array.from(source, Math.abs)), p = sum(Array.from(prefix, Math.abs));
  return s + p > 0 ? s / (s + p) : null;
}

// The target rows of one sentence, as why.py's sentence_rows: teacher-forced `outIds` (target ids without
// BOS/EOS), or (null) the greedy output fed back. -> {tgtInIds, targetIds (the token each row predicts, EOS
// last when finished), mode: "teacher-forced" | "greedy", finished, outIds}
export function attributionTarget(model, srcIds, outIds = null, { off = [] } = {}) {
  const cfg = model.config, limit = cfg.max_len;
  let finished = true, mode = "teacher-forced";
  if (outIds === null || outIds === undefined) {
    const hyp = generate(model, srcIds, { beam: 1, off });
    outIds = hyp.tokens;
    finished = hyp.finished;
    mode = "greedy";
  }
  if (finished && outIds.length + 1 > limit) throw usage("target", `${outIds.length} tokens; the model takes at most ${limit - 1}`);
  const tgtInIds = [cfg.bos_id, ...outIds].slice(0, limit);
  const targetIds = finished ? [...outIds, cfg.eos_id] : outIds.slice(0, tgtInIds.length);
  return { tgtInIds, targetIds, mode, finished, outIds };
}

// The piece of each target id as why.py names it: <s>, </s>, <pad>, else the vocabulary's token ("▁gave")
export function targetPieces(model, idToToken, ids) {
  const cfg = model.config, named = { [cfg.bos_id]: "<s>", [cfg.eos_id]: "</s>", [cfg.pad_id]: "<pad>" };
  return ids.map((id) => named[id] || idToToken(id) || "?");
}

// The whole object `glassformer attribute --json` prints, {method, contrast, integration, rows}, as a generator
// (yields {done, total} after each forward-backward pass). sentence: {srcIds, tgtInIds, targetIds (what each
// row predicts: attributionTarget), sourceUnits (the source's units, as the CLI prints them), targetTokens (the
// piece of each targetIds entry: "▁gave", "</s>"), contrast (the contrast word, or null), contrastToken (its id),
// decode (ids -> text, the target tokenizer's decode; default: the pieces with ▁ as spaces)}.
// opts: {method, steps, rule, tolerance, off}, the CLI's defaults.
export function* attributeReportScan(model, sentence, opts = {}) {
  const { method = DEFAULT_ATTRIBUTION_METHOD, steps = AUTO_STEPS, rule = DEFAULT_RULE, tolerance = DEFAULT_TOLERANCE,
    off = [] } = opts;
  const { srcIds, tgtInIds, targetIds, sourceUnits, targetTokens } = sentence;
  if (!ATTRIBUTION_METHODS.includes(method)) throw usage("method", `expected one of ${ATTRIBUTION_METHODS.join(", ")}, got ${JSON.stringify(method)}`);
  if (sourceUnits.length !== srcIds.length) throw usage("sourceUnits", `${sourceUnits.length} units for ${srcIds.length} source ids`);
  if (targetTokens.length !== targetIds.length) throw usage("targetTokens", `${targetTokens.length} pieces for ${targetIds.length} target ids`);
  const word = sentence.contrast === null || sentence.contrast === undefined ? null : String(sentence.contrast).trim() || null;
  const c = word === null ? null : sentence.contrastToken;
  if (word !== null && !Number.isInteger(c)) throw usage("contrast", `${JSON.stringify(word)} has no token id (contrastToken)`);
  const integrating = method === "integrated-gradients";
  if (integrating) {
    checkSteps(steps);
    checkTolerance(tolerance);
    checkRule(rule);
  }
  const n = targetIds.length;
  if (integrating) checkPasses(n, steps, rule, srcIds.length + tgtInIds.length);
  else if (n > ATTRIBUTION_LIMITS.MAX_ATTRIBUTION_PASSES) {
    throw usage("steps", `rows × passes is ${n}; the limit is ${ATTRIBUTION_LIMITS.MAX_ATTRIBUTION_PASSES} (MAX_ATTRIBUTION_PASSES)`);
  }
  const groups = wordGroups(targetTokens);
  const firsts = new Set(groups.map((g) => g[0]));
  const group = [];
  groups.forEach((g, k) => g.forEach(() => group.push(k)));
  const rows = targetIds.map((_, r) => r);
  let a;
  if (method === "attention" || method === "alti") {
    if (c !== null) {
      throw usage("contrast", method === "attention"
        ? "the attention method reads weights, which do not depend on the predicted token; use a gradient method for a contrast"
        : "alti splits each row's vector among its inputs, whatever token it predicts; use a gradient method for a contrast");
    }
    if (method === "attention") a = attentionRows(model, srcIds, tgtInIds, rows);
    else {
      const m = altiPlus(model, srcIds, tgtInIds), S = srcIds.length, width = m.cols;
      a = { source: rows.map((r) => m.data.slice(r * width, r * width + S)),
        prefix: rows.map((r) => m.data.slice(r * width + S, (r + 1) * width)) };
    }
    a = { ...a, baseline: null, error: null };
  } else {
    const contrasts = c === null ? null : rows.map((r) => (firsts.has(r) ? c : -1));
    a = yield* attributionRows(model, srcIds, tgtInIds, rows, targetIds, { method, steps, rule, tolerance, contrast: contrasts, group, off });
  }
  const wordError = integrating ? groupedErrors(a.source, a.prefix, a.value.map((v, r) => v - a.baseline[r]), group) : null;
  const wordOf = (g) => {
    const pieces = g.map((k) => targetTokens[k]);
    if (pieces.length === 1 && pieces[0].startsWith("<")) return pieces[0];
    const text = sentence.decode ? sentence.decode(g.map((k) => targetIds[k])) : pieces.join("").split("▁").join(" ");
    return text.trim() || pieces.join("").split("▁").join("") || "?";
  };
  const names = ["<s>", ...groups.map(wordOf)];
  const columns = [[0], ...groups.map((g) => g.map((p) => p + 1))];
  const T = tgtInIds.length, alti = method === "alti";
  const merge = (vectors) => {                                         // a word's rows: summed (alti: averaged)
    const out = new Float64Array(vectors[0].length);
    for (const v of vectors) for (let i = 0; i < v.length; i++) out[i] += v[i];
    if (alti) for (let i = 0; i < out.length; i++) out[i] /= vectors.length;
    return out;
  };
  const report = groups.map((g) => {
    const token = wordOf(g);
    const src = merge(g.map((r) => a.source[r])), pre = merge(g.map((r) => a.prefix[r]));
    const prefix = [];
    columns.forEach((col, k) => {
      if (col[0] > g[g.length - 1]) return;
      prefix.push([names[k], sum(col.filter((p) => p < T).map((p) => pre[p]))]);
    });
    const source = sourceUnits.map((u, i) => [u, src[i]]);
    const total = sum(source.map(([, v]) => v)) + sum(prefix.map(([, v]) => v));
    const delta = a.baseline ? sum(g.map((r) => a.value[r] - a.baseline[r])) : null;
    const completeness = wordError === null ? { error: null, steps: null, passes: null }
      : { error: wordError[g[0]], steps: Math.max(...g.map((r) => a.steps[r])), passes: sum(g.map((r) => a.passes[r])) };
    return { position: g[0], token, source, prefix, sum: total, delta, ...completeness,
      source_share: sourceShare(src, pre, method) };
  });
  const integration = integrating
    ? { rule, steps, tolerance, unconverged: report.filter((r) => r.error > tolerance).map((r) => r.token) } : null;
  return { method, contrast: word, integration, rows: report };
}

export function attributeReport(model, sentence, opts = {}) {
  return runToEnd(attributeReportScan(model, sentence, opts), opts.onProgress);
}

// attributionRows run to its end
export function attribution(model, srcIds, tgtInIds, rows, tokens, opts = {}) {
  return runToEnd(attributionRows(model, srcIds, tgtInIds, rows, tokens, opts), opts.onProgress);
}

function runToEnd(scan, onProgress) {
  for (;;) {
    const step = scan.next();
    if (step.done) return step.value;
    if (onProgress) onProgress(step.value);
  }
}

// ---- attribution patching (interpret/attribution_patching.py) -----------------------------------------------

// patchingScan's table (interpret.js), every cell estimated to first order from one backward pass of the
// corrupted run:  p_patched(site) - p_corrupt ~ sum (a_clean - a_corrupt) * dp/da |corrupted run,
// summed over the elements a patch replaces (a head's output at every target row; one encoder position's
// vector). Three passes whatever the model's size: a clean forward, a corrupted forward on a tape, its backward.
// A generator: yields {done, total} after each pass; attributionPatching runs it to its end.
export function* attributionPatchingScan(model, cleanIds, corruptIds, tgtInIds, row, token, { positions = true } = {}) {
  checkPatchArguments(cleanIds, corruptIds, tgtInIds, row, positions);
  const { heads, layers } = patchSites(model);
  const sites = [...heads.flat(), ...(positions ? layers : [])];
  const tgtIn = tgtInIds.slice(0, row + 1);                           // row `row` sees inputs 0..row only
  const total = 3;
  const clean = model.forward(cleanIds, tgtIn, { record: sites });
  const pClean = softmaxRow(clean.logits[row])[token];
  yield { done: 1, total };
  const pass = tapedPass(model, corruptIds, tgtIn, { keep: sites, weights: false });
  const V = pass.logits.cols, p = softmaxRow(pass.logits.data.subarray(row * V, (row + 1) * V));
  const pCorrupt = p[token];
  yield { done: 2, total };
  const dLogits = matrix(pass.logits.rows, V);                         // dp_t/dz = p_t (onehot(t) - p)
  for (let c = 0; c < V; c++) dLogits.data[row * V + c] = pCorrupt * ((c === token ? 1 : 0) - p[c]);
  pass.backward(dLogits);
  yield { done: 3, total };
  const gap = pClean - pCorrupt;
  const cell = (estimate) => ({ p: pCorrupt + estimate, fraction: Math.abs(gap) >= FLAT ? estimate / gap : null });
  // (a_clean - a_corrupt) * dp/da, summed over a site's entries (per position: over each row's features)
  const delta = (name) => {
    const a = clean.probes.get(name), b = pass.ctx.kept.get(name), g = pass.tape.gradIf(b);
    const perRow = new Float64Array(a.rows);
    if (!g) return perRow;
    for (let i = 0; i < a.rows; i++) {
      let s = 0;
      for (let c = 0; c < a.cols; c++) s += (a.data[i * a.cols + c] - b.data[i * a.cols + c]) * g[i * a.cols + c];
      perRow[i] = s;
    }
    return perRow;
  };
  const headEstimates = heads.map((layer) => layer.map((name) => sum(delta(name))));
  const result = {
    p_clean: pClean, p_corrupt: pCorrupt,
    heads: headEstimates.map((layer) => layer.map(cell)),
    all_heads: cell(sum(headEstimates.flat())),
    nothing: cell(0),
    position_layers: positions ? layers : [],
    positions: null,
  };
  if (positions) {
    const perPosition = layers.map(delta);
    result.positions = perPosition.map((estimates) => Array.from(estimates, cell));
    result.all_positions = perPosition.map((estimates) => cell(sum(estimates)));
  }
  return result;
}

export function attributionPatching(model, cleanIds, corruptIds, tgtInIds, row, token, opts = {}) {
  return runToEnd(attributionPatchingScan(model, cleanIds, corruptIds, tgtInIds, row, token, opts), opts.onProgress);
}
