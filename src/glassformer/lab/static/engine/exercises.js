// Exercises in the page: the bug library, sheets from a seed with their audit, and the cell-by-cell checker.
//
// A port of src/glassformer/lesson/exercises/ (bugs.py, generate.py, check.py) with the same design: ONE
// float64 computation of a sheet, cell by cell (a cell is one table of the trace-spec v1 output, named by its
// dotted path: "scores", "self_attention.heads.0.weights", "sublayers.1.normed", "output"); each cell reads
// earlier cells, so it can be run from a student's own numbers; a bug is a set of switches of that
// computation, never a table of numbers. The same seed gives the same sheet as `glassformer exercise new`
// (SplitMix64, drawn as generate.py draws), and the checker gives the same verdicts as `exercise check`.
//
// Tables are arrays of rows of numbers; -Infinity is a masked score, NaN an entry a student left empty.
//
//   newExerciseSheet(kind, seed, {norm, mask, decimals, eps, asked}) -> sheet
//       kind "attention" | "block"; sheet = {kind, seed, doc (exercise.json), decimals, asked, audit, ...}
//   exerciseKey(sheet)                       -> {path: table} every cell of the lesson's computation
//   parseExerciseAnswers(doc, sheet)         -> {path: table} the filled cells of a trace-output document
//   checkExercise(sheet, own)                -> {verdict: right|wrong|empty, bugs, cells: [{path, verdict, bug, off}]}
//   runExerciseWithBug(sheet, id)            -> {path: table} as a student with that bug computes
//   EXERCISE_BUGS                            the library: [{id, readings, claim, en, zh, source, needs}]

const EX_MASK64 = (1n << 64n) - 1n;
const EX_MAX_DRAWS = 200;               // draws of one seed before the generator gives up (generate.py)
const EX_AUDIT_MARGIN = 10.0;           // a bug must move an asked cell by this many rounding tolerances
const EX_EPS = 0.1;                     // the sheets' LayerNorm ε
const EX_MAX_DECIMALS = 8;              // limits.MAX_SHEET_DECIMALS

export class ExerciseError extends Error {
  constructor(message, field) { super(message); this.field = field; }
}

// ---- the switches and the bugs ---------------------------------------------------------------

const EX_RIGHT = Object.freeze({
  divideBy: "d_k",                // "d_k" | "d_model" | "none" (before the softmax)
  divideAfterSoftmax: false,      // ÷√d_k applied to the weights instead
  softmaxOver: "keys",            // "keys" | "queries"
  transposedScores: false,        // S = K Qᵀ instead of Q Kᵀ
  maskAfterSoftmax: false,        // softmax over every key, then masked weights set to 0
  causalShift: 0,                 // 0: query i sees keys j <= i; -1: j < i; +1: j <= i + 1
  lnOver: "features",             // "features" | "table" | "positions"
  lnDdof: 0,                      // 0: population variance; 1: the n-1 estimate
  epsOutsideSqrt: false,          // (x − μ)/(√σ² + ε)
  residual: true,                 // x + Sub(x) (false: Sub(x) alone)
  placement: null,                // null: the sheet's; "pre" / "post": that placement instead
  outputProjection: true,         // Concat(...) W^O (false: the concat itself)
  headsReversed: false,           // Concat(H_H, ..., H_1)
  relu: true,                     // FFN hidden = ReLU(x W_1 + b_1)
});

const exSw = (changes) => Object.freeze({ ...EX_RIGHT, ...changes });

function exBug(id, readings, claim, en, zh, source, needs) {
  return Object.freeze({ id, readings: readings.map(exSw), claim, en, zh, source: source || "", needs: needs || [] });
}

export const EXERCISE_BUGS = Object.freeze([
  exBug("no-scale", [{ divideBy: "none" }], "A4",
    "Scores are divided by √d_k before the softmax; here they were not divided at all.",
    "softmax 之前要把得分除以 √d_k；这里完全没有除。",
    "https://github.com/PAIR-code/tiny-transformers/issues/71"),
  exBug("scale-after-softmax", [{ divideBy: "none", divideAfterSoftmax: true }], "A4",
    "Dot product, then ÷√d_k, then softmax — never softmax first; here the weights were divided instead.",
    "先点积、再除以 √d_k、再 softmax，不能先 softmax；这里除的是权重。",
    "https://github.com/FrancescoSaverioZuppichini/ViT/issues/2"),
  exBug("scale-by-d-model", [{ divideBy: "d_model" }], "B1",
    "Each head divides by √d_k, its own key width; here by √d_model, the width of the whole row.",
    "每个头除以自己的 √d_k；这里除的是整行宽度 √d_model。",
    "https://github.com/omihub777/ViT-CIFAR/pull/11", ["heads>1"]),
  exBug("softmax-over-queries", [{ softmaxOver: "queries" }], "A3",
    "Softmax runs along the keys: each query row sums to 1; here the columns do.",
    "softmax 沿 key 方向：每个 query 行之和为 1；这里是每列之和为 1。",
    "https://github.com/nerminnuraydogan/vision-transformer/issues/1"),
  exBug("transposed-scores", [{ transposedScores: true }], "A2",
    "S = QKᵀ: row i is query i against every key; here the table was KQᵀ (rows and columns swapped).",
    "S = QKᵀ：第 i 行是第 i 个 query 对所有 key；这里算成了 KQᵀ（行列对调）。"),
  exBug("mask-after-softmax", [{ maskAfterSoftmax: true }], "D3",
    "Hidden keys get −∞ before the softmax, so visible weights still sum to 1; here the softmax ran over "
      + "every key and the hidden weights were zeroed afterwards.",
    "被遮住的 key 在 softmax 之前置为 −∞，可见权重之和仍为 1；这里先对全部 key 做 softmax，再把遮住的权重清零。",
    "https://github.com/huggingface/pytorch-image-models/pull/2236", ["mask"]),
  exBug("causal-off-by-one", [{ causalShift: -1 }, { causalShift: 1 }], "D3",
    "Under the causal mask query i reads keys 1..i, itself included; here the triangle was shifted by one.",
    "因果 mask 下第 i 个 query 读 key 1..i，包括它自己；这里三角错了一格。",
    "https://github.com/RVC-Boss/GPT-SoVITS/issues/965", ["causal"]),
  exBug("ln-across-positions", [{ lnOver: "table" }, { lnOver: "positions" }], "B5",
    "LayerNorm takes μ and σ² over the d features of one position; here across positions.",
    "LayerNorm 对单个位置的 d 个特征求 μ 与 σ²；这里跨位置求了。",
    "https://github.com/jadore801120/attention-is-all-you-need-pytorch/pull/17", ["block"]),
  exBug("ln-unbiased-variance", [{ lnDdof: 1 }], "B5",
    "σ² = (1/d) Σ (x_r − μ)²; here the n−1 estimate (÷(d−1)) was used.",
    "σ² = (1/d) Σ (x_r − μ)²；这里用了 n−1 的无偏估计（除以 d−1）。",
    "https://github.com/harvardnlp/annotated-transformer/pull/119", ["block"]),
  exBug("ln-eps-outside-sqrt", [{ epsOutsideSqrt: true }], "B5",
    "LN(x) = γ ⊙ (x − μ)/√(σ² + ε) + β; here ε was added outside the square root.",
    "LN(x) = γ ⊙ (x − μ)/√(σ² + ε) + β；这里 ε 加在了根号外面。",
    "https://github.com/tracel-ai/burn/issues/2185", ["block"]),
  exBug("no-residual", [{ residual: false }], "B4",
    "Each sub-layer adds its input back: LN(x + Sub(x)); here the sub-layer output went on alone.",
    "每个子层都把输入加回来：LN(x + Sub(x))；这里只传了子层输出。",
    "", ["block"]),
  exBug("pre-norm-instead-of-post", [{ placement: "pre" }], "B4",
    "The 2017 block is post-norm, U = LN₁(X + MHA(X)); here LayerNorm was applied before each sub-layer.",
    "2017 的 block 是 post-norm：U = LN₁(X + MHA(X))；这里把 LayerNorm 放到了子层之前。",
    "https://github.com/harvardnlp/annotated-transformer/issues/110", ["block", "post"]),
  exBug("post-norm-instead-of-pre", [{ placement: "post" }], "B4",
    "A pre-norm block is X + MHA(LN(X)); here LayerNorm was applied after the residual add.",
    "pre-norm block 是 X + MHA(LN(X))；这里把 LayerNorm 放到了残差相加之后。",
    "", ["block", "pre"]),
  exBug("no-output-projection", [{ outputProjection: false }], "B2",
    "MHA(X) = Concat(H_1..H_H) W^O; here the concat was used without W^O.",
    "MHA(X) = Concat(H_1..H_H) W^O；这里拼接后没有乘 W^O。",
    "https://github.com/Kyubyong/transformer/issues/117", ["block"]),
  exBug("heads-concat-reversed", [{ headsReversed: true }], "B2",
    "Concat(H_1, ..., H_H) puts head 1 first; here the heads were concatenated in reverse order.",
    "Concat(H_1, ..., H_H) 中头 1 在最前；这里拼接顺序反了。",
    "", ["block", "heads>1"]),
  exBug("ffn-without-relu", [{ relu: false }], "B6",
    "FFN(x) = ReLU(x W_1 + b_1) W_2 + b_2; here the ReLU was left out, so negative entries stayed.",
    "FFN(x) = ReLU(x W_1 + b_1) W_2 + b_2；这里漏了 ReLU，负数没有被截为 0。",
    "", ["block"]),
]);

const EX_BY_ID = new Map(EXERCISE_BUGS.map((b) => [b.id, b]));
export function exerciseBug(id) { return EX_BY_ID.get(id) || null; }

const EX_REASONS = {
  en: {
    block: "the sheet has no LayerNorm, residual, W^O or FFN (an attention sheet)",
    mask: "the sheet has no mask",
    causal: "the sheet has no causal mask",
    "heads>1": "one head given its Q, K, V: √d_model = √d_k and a concat of one head has no order",
    "heads>1 block": "one head: √d_model = √d_k and a concat of one head has no order",
    post: "the sheet is pre-norm",
    pre: "the sheet is post-norm",
    square: "as many queries as keys are needed for KQᵀ to have the shape of QKᵀ",
  },
  zh: {
    block: "这份练习没有 LayerNorm、残差、W^O 或 FFN（注意力练习）",
    mask: "这份练习没有 mask",
    causal: "这份练习没有因果 mask",
    "heads>1": "只有一个给定 Q、K、V 的头：√d_model = √d_k，一个头的拼接也没有顺序",
    "heads>1 block": "只有一个头：√d_model = √d_k，一个头的拼接也没有顺序",
    post: "这份练习是 pre-norm",
    pre: "这份练习是 post-norm",
    square: "query 与 key 一样多时 KQᵀ 才与 QKᵀ 同形",
  },
};

/** Why `bug` cannot show on this kind of sheet (null when it can); `lang` "en" (as bugs.py) or "zh". */
export function exerciseNotCovered(bug, sheet, lang) {
  const words = EX_REASONS[lang || "en"];
  for (const need of bug.needs) {
    const ok = {
      block: sheet.kind === "block", mask: sheet.mask !== "none", causal: sheet.mask === "causal",
      "heads>1": sheet.kind === "block" && sheet.heads.length > 1,
      post: sheet.norm === "post", pre: sheet.norm === "pre",
    }[need];
    if (!ok) return words[need === "heads>1" && sheet.kind === "block" ? "heads>1 block" : need];
  }
  if (bug.id === "transposed-scores" && sheet.nQueries !== sheet.nKeys) return words.square;
  return null;
}

// ---- small table arithmetic -------------------------------------------------------------------

const exMap = (a, f) => a.map((row, i) => row.map((v, j) => f(v, i, j)));
const exCopy = (a) => a.map((row) => row.slice());
const exZerosLike = (a) => a.map((row) => row.map(() => 0));
const exT = (a) => a[0].map((_, j) => a.map((row) => row[j]));

function exMatmul(a, b) {
  const n = a.length, k = b.length, m = b[0].length;
  const out = [];
  for (let i = 0; i < n; i++) {
    const row = new Array(m).fill(0);
    for (let t = 0; t < k; t++) { const x = a[i][t]; for (let j = 0; j < m; j++) row[j] += x * b[t][j]; }
    out.push(row);
  }
  return out;
}

const exAddRow = (a, b) => a.map((row) => row.map((v, j) => v + b[j]));

/** Softmax of the visible entries along `axis` (1: over keys, 0: over queries); none visible: zeros. */
function exSoftmax(scaled, visible, axis) {
  const n = scaled.length, m = scaled[0].length;
  const out = scaled.map((row) => row.map(() => 0));
  const lines = axis === 1 ? n : m, len = axis === 1 ? m : n;
  for (let l = 0; l < lines; l++) {
    const at = (x) => (axis === 1 ? [l, x] : [x, l]);
    let top = -Infinity;
    for (let x = 0; x < len; x++) { const [i, j] = at(x); if (visible[i][j] && scaled[i][j] > top) top = scaled[i][j]; }
    if (!Number.isFinite(top)) top = 0;
    let total = 0;
    const e = new Array(len).fill(0);
    for (let x = 0; x < len; x++) { const [i, j] = at(x); if (visible[i][j]) { e[x] = Math.exp(scaled[i][j] - top); total += e[x]; } }
    for (let x = 0; x < len; x++) { const [i, j] = at(x); out[i][j] = total > 0 ? e[x] / total : 0; }
  }
  return out;
}

/** γ ⊙ (x − μ)/√(σ² + ε) + β, μ and σ² over the features of each row (as the switches say). */
function exLayerNorm(x, gamma, beta, eps, sw) {
  const n = x.length, d = x[0].length;
  const groups = [];                            // lists of [i, j] sharing one μ and σ²
  if (sw.lnOver === "features") for (let i = 0; i < n; i++) groups.push(x[i].map((_, j) => [i, j]));
  else if (sw.lnOver === "positions") for (let j = 0; j < d; j++) groups.push(x.map((_, i) => [i, j]));
  else groups.push(x.flatMap((row, i) => row.map((_, j) => [i, j])));
  const out = exZerosLike(x);
  for (const g of groups) {
    let sum = 0;
    for (const [i, j] of g) sum += x[i][j];
    const mu = sum / g.length;
    let sq = 0;
    for (const [i, j] of g) sq += (x[i][j] - mu) ** 2;
    const v = sq / Math.max(g.length - sw.lnDdof, 1);
    const scale = sw.epsOutsideSqrt ? Math.sqrt(v) + eps : Math.sqrt(v + eps);
    for (const [i, j] of g) out[i][j] = (gamma[j] * (x[i][j] - mu)) / scale + beta[j];
  }
  return out;
}

// ---- the one computation ------------------------------------------------------------------------

function exVisible(sheet, shift) {
  const out = [];
  for (let i = 0; i < sheet.nQueries; i++) {
    const row = [];
    for (let j = 0; j < sheet.nKeys; j++) row.push(sheet.mask === "causal" ? j <= i + shift : true);
    out.push(row);
  }
  return out;
}

function exAttentionCells(sheet, sw, prefix, dK, qIn, kIn, vPath) {
  const visible = exVisible(sheet, sw.causalShift);
  const divisor = { d_k: Math.sqrt(dK), d_model: Math.sqrt(sheet.dModel), none: 1.0 }[sw.divideBy];
  const scores = (q, k) => (sw.transposedScores ? exMatmul(k, exT(q)) : exMatmul(q, exT(k)));   // (query, key)
  const scaled = (s) => {
    const out = exMap(s, (v) => v / divisor);
    return sw.maskAfterSoftmax ? out : exMap(out, (v, i, j) => (visible[i][j] ? v : -Infinity));
  };
  const weights = (a) => {
    const seen = exMap(a, (v, i, j) => (sw.maskAfterSoftmax ? Number.isFinite(v) : visible[i][j] && Number.isFinite(v)));
    let w = exSoftmax(a, seen, sw.softmaxOver === "keys" ? 1 : 0);
    if (sw.divideAfterSoftmax) w = exMap(w, (v) => v / Math.sqrt(dK));
    if (sw.maskAfterSoftmax) w = exMap(w, (v, i, j) => (visible[i][j] ? v : 0));
    return w;
  };
  const p = prefix ? prefix + "." : "";
  return [
    kIn ? { path: `${p}scores`, inputs: [qIn, kIn], fn: scores }
      : { path: `${p}scores`, inputs: [], fn: () => scores(sheet.q, sheet.k) },
    { path: `${p}scaled_scores`, inputs: [`${p}scores`], fn: scaled },
    { path: `${p}weights`, inputs: [`${p}scaled_scores`], fn: weights },
    vPath ? { path: `${p}output`, inputs: [`${p}weights`, vPath], fn: (w, v) => exMatmul(w, v) }
      : { path: `${p}output`, inputs: [`${p}weights`], fn: (w) => exMatmul(w, sheet.v) },
  ];
}

/** Every cell of the sheet's trace output in computation order, each computed as `sw` says. */
export function exerciseCells(sheet, sw) {
  sw = sw || EX_RIGHT;
  if (sheet.kind === "attention") return exAttentionCells(sheet, sw, "", sheet.q[0].length, "", null, null);
  const placement = sw.placement || sheet.norm;
  const ln = sheet.layerNorms;
  const out = [{ path: "sublayers.0.input", inputs: [], fn: () => exCopy(sheet.x) }];
  const norm = (s) => (a) => exLayerNorm(a, ln[s].gamma, ln[s].beta, sheet.eps, sw);
  if (placement === "pre") out.push({ path: "sublayers.0.normed", inputs: ["sublayers.0.input"], fn: norm(0) });
  const attnIn = placement === "pre" ? "sublayers.0.normed" : "sublayers.0.input";
  sheet.heads.forEach((h, r) => {
    const hp = `self_attention.heads.${r}`;
    for (const name of ["q", "k", "v"]) {
      const w = h["w_" + name], b = h["b_" + name];
      out.push({ path: `${hp}.${name}`, inputs: [attnIn], fn: (a) => exAddRow(exMatmul(a, w), b) });
    }
    out.push(...exAttentionCells(sheet, sw, hp, h.w_q[0].length, `${hp}.q`, `${hp}.k`, `${hp}.v`));
  });
  const concat = (...outputs) => {
    let parts = outputs.map((o, r) => (sheet.disabledHeads.includes(r) ? exZerosLike(o) : o));
    if (sw.headsReversed) parts = parts.slice().reverse();
    return parts[0].map((_, i) => parts.flatMap((o) => o[i]));                     // (n, H·d_v)
  };
  out.push({ path: "self_attention.concat", inputs: sheet.heads.map((_, r) => `self_attention.heads.${r}.output`), fn: concat });
  const wO = sheet.wO, bO = sheet.bO;
  out.push({ path: "self_attention.output", inputs: ["self_attention.concat"],
    fn: sw.outputProjection ? (c) => exAddRow(exMatmul(c, wO), bO) : (c) => exCopy(c) });
  const add = (a, b) => (sw.residual ? exMap(a, (v, i, j) => v + b[i][j]) : exCopy(b));
  out.push({ path: "sublayers.0.residual", inputs: ["sublayers.0.input", "self_attention.output"], fn: add });
  let ffnIn;
  if (placement === "post") {
    out.push({ path: "sublayers.0.normed", inputs: ["sublayers.0.residual"], fn: norm(0) });
    out.push({ path: "sublayers.1.input", inputs: ["sublayers.0.normed"], fn: exCopy });
    ffnIn = "sublayers.1.input";
  } else {
    out.push({ path: "sublayers.1.input", inputs: ["sublayers.0.residual"], fn: exCopy });
    out.push({ path: "sublayers.1.normed", inputs: ["sublayers.1.input"], fn: norm(1) });
    ffnIn = "sublayers.1.normed";
  }
  const f = sheet.ffn;
  out.push({ path: "ffn.hidden", inputs: [ffnIn], fn: (a) => {
    const h = exAddRow(exMatmul(a, f.w_1), f.b_1);
    return sw.relu ? exMap(h, (v) => (Number.isNaN(v) ? v : Math.max(v, 0))) : h;
  } });
  out.push({ path: "ffn.output", inputs: ["ffn.hidden"], fn: (h) => exAddRow(exMatmul(h, f.w_2), f.b_2) });
  out.push({ path: "sublayers.1.residual", inputs: ["sublayers.1.input", "ffn.output"], fn: add });
  if (placement === "post") {
    out.push({ path: "sublayers.1.normed", inputs: ["sublayers.1.residual"], fn: norm(1) });
    out.push({ path: "output", inputs: ["sublayers.1.normed"], fn: exCopy });
  } else {
    out.push({ path: "output", inputs: ["sublayers.1.residual"], fn: exCopy });
  }
  return out;
}

/** A student's table where they wrote a number, the computed one where they left an entry empty (NaN). */
function exMerge(own, computed) {
  return own ? exMap(own, (v, i, j) => (Number.isNaN(v) ? computed[i][j] : v)) : computed;
}

/** Every cell as `sw` computes it; with `own`, each cell from the student's own earlier cells. */
export function runExercise(sheet, sw, own) {
  const values = {};
  for (const cell of exerciseCells(sheet, sw)) {
    values[cell.path] = cell.fn(...cell.inputs.map((p) => exMerge(own ? own[p] : null, values[p])));
  }
  return values;
}

export function exerciseKey(sheet) { return runExercise(sheet, EX_RIGHT); }

/** Every cell as a student with bug `id` computes it (its first reading), from the sheet's inputs. */
export function runExerciseWithBug(sheet, id) {
  const bug = EX_BY_ID.get(id);
  if (!bug) throw new ExerciseError(`bug: no bug ${JSON.stringify(id)} in the library`, "bug");
  return runExercise(sheet, bug.readings[0]);
}

// ---- sheets: the spec a computation reads ---------------------------------------------------------

const exZeros1 = (n) => new Array(n).fill(0);

/** A sheet from its trace-spec document (as the generator draws them: attention or encoder_block, mask none or
 * causal, biases and γ/β at their defaults). */
export function exerciseSheetOf(doc, decimals) {
  const sheet = { doc, decimals: decimals === undefined ? 4 : decimals, mask: doc.mask || "none", disabledHeads: [] };
  if (doc.kind === "attention") {
    Object.assign(sheet, { kind: "attention", q: doc.q, k: doc.k, v: doc.v, norm: null, heads: [{}],
      nQueries: doc.q.length, nKeys: doc.k.length, dModel: doc.q[0].length });
  } else {
    const d = doc.x[0].length;
    const heads = doc.self_attention.heads.map((h) => ({ ...h,
      b_q: h.b_q || exZeros1(h.w_q[0].length), b_k: h.b_k || exZeros1(h.w_k[0].length), b_v: h.b_v || exZeros1(h.w_v[0].length) }));
    const ffn = { ...doc.ffn, b_1: doc.ffn.b_1 || exZeros1(doc.ffn.w_1[0].length), b_2: doc.ffn.b_2 || exZeros1(d) };
    const lns = doc.layer_norms || [{}, {}];
    Object.assign(sheet, { kind: "block", x: doc.x, heads, ffn, norm: doc.norm || "post", eps: doc.eps,
      wO: doc.self_attention.w_o, bO: doc.self_attention.b_o || exZeros1(d),
      layerNorms: lns.map((l) => ({ gamma: l.gamma || new Array(d).fill(1), beta: l.beta || exZeros1(d) })),
      disabledHeads: doc.disabled_heads || [], nQueries: doc.x.length, nKeys: doc.x.length, dModel: d });
  }
  sheet.tolerance = 0.5 * 10.0 ** -sheet.decimals;
  sheet.asked = exerciseDefaultAsked(sheet);
  return sheet;
}

/** Every cell a student computes: the trace output's tables less the copies. */
export function exerciseDefaultAsked(sheet) {
  const copies = new Set(["sublayers.0.input", "sublayers.1.input",
    sheet.norm === "post" ? "sublayers.1.normed" : "sublayers.1.residual"]);
  return exerciseCells(sheet).map((c) => c.path).filter((p) => !copies.has(p));
}

// ---- drawing numbers: SplitMix64, draw for draw as generate.py ------------------------------------

export class SplitMix64 {
  constructor(seed) { this.state = BigInt(seed) & EX_MASK64; }
  next() {
    this.state = (this.state + 0x9E3779B97F4A7C15n) & EX_MASK64;
    let z = this.state;
    z = ((z ^ (z >> 30n)) * 0xBF58476D1CE4E5B9n) & EX_MASK64;
    z = ((z ^ (z >> 27n)) * 0x94D049BB133111EBn) & EX_MASK64;
    return z ^ (z >> 31n);
  }
  below(n) {                                   // uniform in [0, n), by rejection
    const big = BigInt(n), limit = (1n << 64n) - ((1n << 64n) % big);
    for (;;) { const u = this.next(); if (u < limit) return Number(u % big); }
  }
}

function exInts(rng, [n, m], low, high) {
  const out = [];
  for (let i = 0; i < n; i++) { const row = []; for (let j = 0; j < m; j++) row.push(low + rng.below(high - low + 1)); out.push(row); }
  return out;
}

function exChoice(rng, [n, m], [values, weights]) {
  const total = weights.reduce((a, b) => a + b, 0);
  const one = () => {
    let r = rng.below(total);
    for (let k = 0; k < values.length; k++) { if (r < weights[k]) return values[k]; r -= weights[k]; }
    throw new Error("unreachable");
  };
  const out = [];
  for (let i = 0; i < n; i++) { const row = []; for (let j = 0; j < m; j++) row.push(one()); out.push(row); }
  return out;
}

const EX_SPARSE = [[0, 1, -1], [2, 1, 1]];
const EX_HALVES = [[0, 0.5, -0.5, 1, -1], [4, 2, 2, 1, 1]];

function exDrawAttention(rng, mask) {
  const q = exInts(rng, [3, 2], -2, 2), k = exInts(rng, [3, 2], -2, 2), v = exInts(rng, [3, 2], -3, 3);
  return { version: 1, kind: "attention", q, k, v, scale: true, mask };
}

function exDrawBlock(rng, norm, mask, eps) {
  const heads = [];
  for (let r = 0; r < 2; r++) {
    const w_q = exChoice(rng, [4, 2], EX_SPARSE), w_k = exChoice(rng, [4, 2], EX_SPARSE), w_v = exChoice(rng, [4, 2], EX_SPARSE);
    heads.push({ w_q, w_k, w_v });
  }
  const x = exInts(rng, [3, 4], -2, 2);
  const w_o = exChoice(rng, [4, 4], EX_SPARSE), w_1 = exChoice(rng, [4, 6], EX_SPARSE), w_2 = exChoice(rng, [6, 4], EX_HALVES);
  return { version: 1, kind: "encoder_block", x, self_attention: { heads, w_o },
    ffn: { w_1, w_2, activation: "relu" }, norm, eps, scale: true, mask };
}

// ---- the audit ---------------------------------------------------------------------------------------

/** Largest difference of two tables; a masked (−∞) entry against a number is infinitely far. */
function exDistance(a, b) {
  let worst = 0;
  for (let i = 0; i < a.length; i++) {
    for (let j = 0; j < a[i].length; j++) {
      const x = a[i][j], y = b[i][j], fx = Number.isFinite(x), fy = Number.isFinite(y);
      if (fx !== fy || (!fx && x !== y)) return Infinity;
      if (fx && Math.abs(x - y) > worst) worst = Math.abs(x - y);
    }
  }
  return worst;
}

const exCellsDistance = (x, y, asked) => asked.reduce((m, p) => Math.max(m, exDistance(x[p], y[p])), 0);

function exCoveredBugs(sheet) { return EXERCISE_BUGS.filter((b) => exerciseNotCovered(b, sheet) === null); }

/** Does every bug that can happen here show on an asked cell, and can every two be told apart? */
export function auditExercise(sheet, margin) {
  margin = margin === undefined ? EX_AUDIT_MARGIN * sheet.tolerance : margin;
  const key = runExercise(sheet, EX_RIGHT);
  const result = { covered: [], notCovered: [], problems: [] };
  for (const b of EXERCISE_BUGS) {
    const reason = exerciseNotCovered(b, sheet);
    if (reason !== null) result.notCovered.push({ bug: b.id, reason });
  }
  const runs = new Map(exCoveredBugs(sheet).map((b) => [b.id, b.readings.map((sw) => runExercise(sheet, sw))]));
  for (const [id, readings] of runs) {
    result.covered.push(id);
    readings.forEach((values, r) => {
      if (exCellsDistance(values, key, sheet.asked) <= margin) {
        result.problems.push(`${id}${readings.length > 1 ? ` (reading ${r + 1})` : ""} changes no asked cell by more than ${margin}`);
      }
    });
  }
  const ids = [...runs.keys()];
  for (let i = 0; i < ids.length; i++) {
    for (const b of ids.slice(i + 1)) {
      const a = ids[i];
      if (runs.get(a).some((x) => runs.get(b).some((y) => exCellsDistance(x, y, sheet.asked) <= margin))) {
        result.problems.push(`${a} and ${b} give the same numbers on every asked cell`);
      }
    }
  }
  return result;
}

// ---- a sheet from a seed -------------------------------------------------------------------------------

/** The sheet of `seed`: drawn again until its audit passes (at most EX_MAX_DRAWS times), as generate.py. */
export function newExerciseSheet(kind, seed, opts) {
  opts = opts || {};
  if (kind !== "attention" && kind !== "block") throw new ExerciseError(`kind: expected attention or block, got ${JSON.stringify(kind)}`, "kind");
  if (!Number.isSafeInteger(seed) || seed < 0) throw new ExerciseError(`seed: expected a whole number 0..${Number.MAX_SAFE_INTEGER}, got ${seed}`, "seed");
  const decimals = opts.decimals === undefined ? 4 : opts.decimals;
  if (!Number.isInteger(decimals) || decimals < 0 || decimals > EX_MAX_DECIMALS) {
    throw new ExerciseError(`decimals: expected 0..${EX_MAX_DECIMALS}, got ${decimals}`, "decimals");
  }
  const norm = opts.norm || "post";
  if (norm !== "post" && norm !== "pre") throw new ExerciseError(`norm: expected post or pre, got ${JSON.stringify(norm)}`, "norm");
  const mask = opts.mask || (kind === "attention" ? "causal" : "none");
  if (mask !== "none" && mask !== "causal") throw new ExerciseError(`mask: expected none or causal, got ${JSON.stringify(mask)}`, "mask");
  const eps = opts.eps === undefined ? EX_EPS : opts.eps;
  const rng = new SplitMix64(seed);
  let last = [];
  for (let draw = 1; draw <= EX_MAX_DRAWS; draw++) {
    const doc = kind === "attention" ? exDrawAttention(rng, mask) : exDrawBlock(rng, norm, mask, eps);
    const sheet = exerciseSheetOf(doc, decimals);
    sheet.seed = seed;
    if (opts.asked) {
      const unknown = opts.asked.filter((a) => !sheet.asked.includes(a));
      if (unknown.length) throw new ExerciseError(`asked: ${JSON.stringify(unknown[0])} is not a cell of a ${kind} sheet`, "asked");
      sheet.asked = opts.asked.slice();
    }
    const result = auditExercise(sheet);
    if (result.problems.length === 0) {
      const margin = EX_AUDIT_MARGIN * sheet.tolerance;
      sheet.audit = { covered: result.covered, not_covered: result.notCovered, draws: draw, margin };
      return sheet;
    }
    last = result.problems;
  }
  throw new ExerciseError(`no ${kind} sheet of seed ${seed} passes the audit in ${EX_MAX_DRAWS} draws (${last[0]}`
    + `${last.length > 1 ? " and more" : ""}); ask more cells or fewer decimals`, "seed");
}

// ---- reading answers ---------------------------------------------------------------------------------

const EX_MASKED_WORDS = ["-inf", "−∞", "-∞", "-Infinity"];
const EX_IGNORED = { "": ["version", "kind"], heads: ["disabled"], sublayers: ["name"] };

/** One table of a student's: numbers, null (left empty) or "-inf" (a masked score); null when all empty. */
export function parseExerciseTable(value, shape, path) {
  if (value === null || value === undefined) return null;
  const [n, m] = shape;
  if (!Array.isArray(value) || !value.every((r) => Array.isArray(r) || r === null)) {
    throw new ExerciseError(`${path}: expected a table (${n} rows of ${m} numbers)`, path);
  }
  if (value.length !== n) throw new ExerciseError(`${path}: expected ${n}×${m}, got ${value.length} rows`, path);
  let any = false;
  const out = value.map((row, i) => {
    if (row === null) return new Array(m).fill(NaN);
    if (row.length !== m) throw new ExerciseError(`${path}[${i}]: expected ${m} numbers (${n}×${m}), got ${row.length}`, `${path}[${i}]`);
    return row.map((v, j) => {
      const at = `${path}[${i}][${j}]`;
      if (v === null || v === undefined || (typeof v === "string" && v.trim() === "")) return NaN;
      if (typeof v === "string" && EX_MASKED_WORDS.includes(v.trim())) { any = true; return -Infinity; }
      const x = typeof v === "string" ? Number(v.trim()) : v;
      if (typeof x !== "number" || Number.isNaN(x)) {
        throw new ExerciseError(`${at}: expected a number, null or "-inf", got ${JSON.stringify(v).slice(0, 40)}`, at);
      }
      if (!Number.isFinite(x)) throw new ExerciseError(`${at}: non-finite number ${v} (leave it empty, or "-inf" for a masked score)`, at);
      any = true;
      return x;
    });
  });
  return any ? out : null;
}

/** The filled cells of an answers document (a trace-spec v1 output, any subset filled in). */
export function parseExerciseAnswers(doc, sheet) {
  const key = exerciseKey(sheet);
  const root = {};
  for (const path of Object.keys(key)) {
    let node = root;
    const parts = path.split(".");
    for (const part of parts.slice(0, -1)) node = node[part] || (node[part] = {});
    node[parts[parts.length - 1]] = path;
  }
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) {
    throw new ExerciseError("answers: expected a JSON object (a trace output with the cells you computed)", "answers");
  }
  if ("version" in doc && doc.version !== 1) throw new ExerciseError(`version: expected 1, got ${JSON.stringify(doc.version)}`, "version");
  const found = {};
  const walk = (value, node, path, level) => {
    if (typeof node === "string") {
      const table = parseExerciseTable(value, [key[node].length, key[node][0].length], node);
      if (table) found[node] = table;
      return;
    }
    if (value === null || value === undefined) return;
    const keys = Object.keys(node);
    if (keys.every((k) => /^\d+$/.test(k))) {
      if (!Array.isArray(value)) throw new ExerciseError(`${path}: expected a list`, path);
      if (value.length > keys.length) throw new ExerciseError(`${path}: ${value.length} entries, the sheet has ${keys.length}`, path);
      value.forEach((item, i) => walk(item, node[i], `${path}.${i}`, path.split(".").pop()));
      return;
    }
    if (typeof value !== "object" || Array.isArray(value)) throw new ExerciseError(`${path || "answers"}: expected an object`, path);
    for (const [name, item] of Object.entries(value)) {
      const sub = path ? `${path}.${name}` : name;
      if (Object.prototype.hasOwnProperty.call(node, name)) walk(item, node[name], sub, name);
      else if (!(EX_IGNORED[level] || []).includes(name)) throw new ExerciseError(`${sub}: unknown cell (here: ${keys.join(", ")})`, sub);
    }
  };
  walk(doc, root, "", "");
  return found;
}

// ---- comparing -----------------------------------------------------------------------------------------

/** Per entry: true where the student left it empty or wrote what `ref` holds within `tol` (a number or a table). */
function exAgrees(own, ref, tol) {
  return exMap(own, (o, i, j) => {
    if (Number.isNaN(o)) return true;
    const r = ref[i][j], t = typeof tol === "number" ? tol : tol[i][j];
    const masked = !Number.isFinite(r) || !Number.isFinite(o);
    if (masked) return Math.abs(o) === Infinity && Math.abs(r) === Infinity;
    return Math.abs(o - r) <= t;
  });
}

const exAll = (a) => a.every((row) => row.every(Boolean));

/** Per output entry: half + half · Σ|∂out/∂in| over every finite entry the cell reads (finite differences). */
function exRoundingBound(cell, args, half, h) {
  h = h || 1e-6;
  const base = cell.fn(...args);
  const total = exZerosLike(base);
  args.forEach((arg, a) => {
    arg.forEach((row, i) => row.forEach((v, j) => {
      if (!Number.isFinite(v)) return;
      const slopes = [h, -h].map((step) => {
        const moved = args.map(exCopy);
        moved[a][i][j] += step;
        const out = cell.fn(...moved);
        return exMap(out, (x, r, c) => (Number.isFinite(x) && Number.isFinite(base[r][c]) ? Math.abs(x - base[r][c]) / h : 0));
      });
      for (let r = 0; r < total.length; r++) {
        for (let c = 0; c < total[r].length; c++) {
          const s0 = slopes[0][r][c], s1 = slopes[1][r][c];
          total[r][c] += Number.isNaN(s0) || Number.isNaN(s1) ? NaN : Math.max(s0, s1);
        }
      }
    }));
  });
  return exMap(total, (v) => half + half * v + 1e-9);
}

/** Every filled cell judged against the key, then against the student's own earlier cells, then against
 * each bug of the library that the sheet covers (check.py's rules, in the same order). */
export function checkExercise(sheet, own) {
  const half = sheet.tolerance;
  const tol = half * (1 + 1e-9) + 1e-12;
  const key = runExercise(sheet, EX_RIGHT);
  const local = runExercise(sheet, EX_RIGHT, own);
  const graph = exerciseCells(sheet);
  const bugs = exCoveredBugs(sheet);
  const variants = new Map(bugs.map((b) => [b.id, b.readings.map((sw) => [runExercise(sheet, sw, own), runExercise(sheet, sw)])]));
  const verdicts = [];
  const explains = new Map();
  const fits = new Map(bugs.map((b) => [b.id, 0]));
  const fine = {};
  const fitsBug = (b, path, mine, bound) => variants.get(b.id).some(([lv, fv]) =>
    exAll(exAgrees(mine, lv[path], bound)) || exAll(exAgrees(mine, fv[path], tol)));
  for (const cell of graph) {
    const inputsRight = cell.inputs.every((p) => fine[p]);
    if (!(cell.path in own)) { fine[cell.path] = inputsRight; continue; }
    const mine = own[cell.path];
    const args = cell.inputs.map((p) => exMerge(own[p], local[p]));
    const bound = cell.inputs.length ? exRoundingBound(cell, args, half) : exMap(mine, () => tol);
    const fromOwn = exAgrees(mine, local[cell.path], bound);
    for (const b of bugs) if (fitsBug(b, cell.path, mine, bound)) fits.set(b.id, fits.get(b.id) + 1);
    if (exAll(exAgrees(mine, key[cell.path], tol)) || (inputsRight && exAll(fromOwn))) {
      verdicts.push({ path: cell.path, verdict: "right", bug: null, off: [] });
      fine[cell.path] = true;
      continue;
    }
    fine[cell.path] = false;
    if (exAll(fromOwn)) {
      verdicts.push({ path: cell.path, verdict: "carried", bug: null, off: [] });
    } else {
      const off = [];
      fromOwn.forEach((row, i) => row.forEach((ok, j) => { if (!ok) off.push([i, j]); }));
      verdicts.push({ path: cell.path, verdict: "wrong", bug: "slip", off });
      explains.set(cell.path, new Set(bugs.filter((b) => fitsBug(b, cell.path, mine, bound)).map((b) => b.id)));
    }
  }
  // name as few bugs as explain every wrong cell: the bug explaining most cells first, then the one whose whole
  // computation the student's table follows most often, then the library's order
  const order = new Map(bugs.map((b, i) => [b.id, i]));
  const open = new Set([...explains].filter(([, ids]) => ids.size).map(([p]) => p));
  const named = new Map();
  while (open.size) {
    const candidates = new Set([...open].flatMap((p) => [...explains.get(p)]));
    let best = null, bestKey = null;
    for (const id of candidates) {
      const k = [[...open].filter((p) => explains.get(p).has(id)).length, fits.get(id), -order.get(id)];
      if (bestKey === null || k[0] > bestKey[0] || (k[0] === bestKey[0] && (k[1] > bestKey[1]
          || (k[1] === bestKey[1] && k[2] > bestKey[2])))) { best = id; bestKey = k; }
    }
    for (const p of [...open]) if (explains.get(p).has(best)) { named.set(p, best); open.delete(p); }
  }
  const names = [];
  for (const v of verdicts) {
    if (named.has(v.path)) { v.bug = named.get(v.path); if (!names.includes(v.bug)) names.push(v.bug); }
  }
  // an empty hand-in never passes (check.py's Report.verdict): "empty", not "right"
  const verdict = !verdicts.length ? "empty" : verdicts.every((c) => c.verdict === "right") ? "right" : "wrong";
  return { verdict, bugs: names, cells: verdicts };
}
