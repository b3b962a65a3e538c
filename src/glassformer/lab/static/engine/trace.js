// Trace spec v1 in the page: one attention head or one block, every intermediate, as lesson/reference.py
// computes it (row vectors, x @ W with W stored d_in x d_out, float64; masks 1 = may attend, padding
// flags true = PAD). Nested arrays in, the same JSON out: masked scaled scores are null.
// The small primitives (matmul, softmaxRows, layerNorm, attention) work on number[][] and are exported
// for exercise checkers.

export const TRACE_SUBLAYERS = {
  encoder_block: ["self_attention", "ffn"],
  decoder_block: ["self_attention", "cross_attention", "ffn"],
};
export const TRACE_LIMITS = { rows: 256, width: 512, heads: 32, elements: 65536, magnitude: 1e12 };   // as glassformer.limits

// ---- primitives on number[][] -------------------------------------------------------------------------

export function zeros(n, m) {
  return Array.from({ length: n }, () => new Array(m).fill(0));
}

export function transpose(a) {
  return a[0].map((_, j) => a.map((row) => row[j]));
}

// (n, k) @ (k, m) -> (n, m)
export function matmul(a, b) {
  const n = a.length, k = b.length, m = b[0].length;
  const out = zeros(n, m);
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < m; j++) {
      let sum = 0;
      for (let r = 0; r < k; r++) sum += a[i][r] * b[r][j];
      out[i][j] = sum;
    }
  }
  return out;
}

function addRow(a, v) {
  return a.map((row) => row.map((x, j) => x + v[j]));
}

function addMatrix(a, b) {
  return a.map((row, i) => row.map((x, j) => x + b[i][j]));
}

// softmax of each row over its visible keys (visible: booleans, or omitted = all); no visible key: zeros
export function softmaxRows(scores, visible = null) {
  return scores.map((row, i) => {
    const seen = row.map((_, j) => (visible ? !!visible[i][j] : true));
    if (!seen.some(Boolean)) return row.map(() => 0);
    let top = -Infinity;
    row.forEach((s, j) => { if (seen[j] && s > top) top = s; });
    const e = row.map((s, j) => (seen[j] ? Math.exp(s - top) : 0));
    const total = e.reduce((a, b) => a + b, 0);
    return e.map((x) => x / total);
  });
}

// gamma * (x - mean) / sqrt(var + eps) + beta, mean and (population) variance over each row's d features
export function layerNorm(x, gamma, beta, eps) {
  return x.map((row) => {
    const d = row.length;
    const mu = row.reduce((a, b) => a + b, 0) / d;
    const variance = row.reduce((a, b) => a + (b - mu) * (b - mu), 0) / d;
    const root = Math.sqrt(variance + eps);
    return row.map((v, k) => (gamma[k] * (v - mu)) / root + beta[k]);
  });
}

// One head: S = Q K^T; S / sqrt(d_k) (if scale); -inf where masked; A = softmax over keys; Y = A V
export function attention(q, k, v, { visible = null, scale = true } = {}) {
  const scores = matmul(q, transpose(k));                                // (n, m)
  const root = Math.sqrt(q[0].length);
  const scaled = scores.map((row, i) => row.map((s, j) =>
    (visible && !visible[i][j] ? -Infinity : scale ? s / root : s)));
  const weights = softmaxRows(scaled, visible);
  return { scores, scaled_scores: scaled, weights, output: matmul(weights, v) };
}

// ---- checking a document --------------------------------------------------------------------------------

function specError(field, detail) {
  return new Error(`${field}: ${detail}`);
}

function checkMatrix(value, field, rows = null, cols = null, what = "") {
  if (!Array.isArray(value) || value.length === 0 || !Array.isArray(value[0]) || value[0].length === 0) {
    throw specError(field, "expected a non-empty matrix (a list of rows of numbers)");
  }
  const width = value[0].length;
  if (value.length > TRACE_LIMITS.rows) throw specError(field, `${value.length} rows, over the limit of ${TRACE_LIMITS.rows}`);
  if (width > TRACE_LIMITS.width) throw specError(field, `${width} columns, over the limit of ${TRACE_LIMITS.width}`);
  value.forEach((row, i) => {
    if (!Array.isArray(row) || row.length !== width) {
      throw specError(`${field}[${i}]`, `ragged rows: row 0 has ${width} numbers, row ${i} has ${Array.isArray(row) ? row.length : "none"}`);
    }
    row.forEach((x, j) => {
      if (typeof x !== "number" || !Number.isFinite(x)) throw specError(`${field}[${i}][${j}]`, "expected a finite number");
      checkMagnitude(x, `${field}[${i}][${j}]`);
    });
  });
  if ((rows !== null && value.length !== rows) || (cols !== null && width !== cols)) {
    throw specError(field, `expected ${rows ?? "?"}×${cols ?? "?"} (${what}), got ${value.length}×${width}`);
  }
  return value;
}

function checkVector(value, field, n, fill) {
  if (value === undefined || value === null) return new Array(n).fill(fill);
  if (!Array.isArray(value) || value.length !== n || value.some((x) => typeof x !== "number" || !Number.isFinite(x))) {
    throw specError(field, `expected ${n} finite numbers`);
  }
  value.forEach((x, i) => checkMagnitude(x, `${field}[${i}]`));
  return value;
}

// |x| within TRACE_LIMITS.magnitude (MAX_SPEC_MAGNITUDE): within it and the sizes, nothing overflows float64
function checkMagnitude(x, field) {
  if (Math.abs(x) > TRACE_LIMITS.magnitude) {
    throw specError(field, `${x.toExponential()} is beyond ±${TRACE_LIMITS.magnitude.toExponential()} (MAX_SPEC_MAGNITUDE)`);
  }
}

function checkFlags(value, field, n) {
  if (!Array.isArray(value) || value.length !== n || value.some((x) => typeof x !== "boolean")) {
    throw specError(field, `expected ${n} booleans`);
  }
  return value;
}

// (n, m) booleans, true = may attend: the mask word or table, AND the key padding
function visibility(doc, n, m) {
  const mask = doc.mask ?? "none";
  let visible;
  if (Array.isArray(mask)) {
    if (mask.length !== n || mask.some((row) => !Array.isArray(row) || row.length !== m || row.some((x) => typeof x !== "boolean"))) {
      throw specError("mask", `expected ${n}×${m} booleans (n×m)`);
    }
    visible = mask.map((row) => row.slice());
  } else if (mask === "causal") {
    visible = Array.from({ length: n }, (_, i) => Array.from({ length: m }, (_, j) => j <= i));
  } else if (mask === "none") {
    visible = Array.from({ length: n }, () => new Array(m).fill(true));
  } else {
    throw specError("mask", `expected "none", "causal" or an n×m table, got ${JSON.stringify(mask).slice(0, 40)}`);
  }
  if (doc.key_padding !== undefined && doc.key_padding !== null) {
    const pad = checkFlags(doc.key_padding, "key_padding", m);
    visible = visible.map((row) => row.map((v, j) => v && !pad[j]));
  }
  return visible;
}

function checkHeads(p, field, d) {
  if (!p || typeof p !== "object" || !Array.isArray(p.heads) || p.heads.length === 0) {
    throw specError(`${field}.heads`, "expected at least one head");
  }
  if (p.heads.length > TRACE_LIMITS.heads) throw specError(`${field}.heads`, `${p.heads.length} heads, over the limit of ${TRACE_LIMITS.heads}`);
  let dk = null, dv = null;
  p.heads.forEach((h, r) => {
    const f = `${field}.heads[${r}]`;
    dk = checkMatrix(h.w_q, `${f}.w_q`, d, dk, "d×d_k")[0].length;
    checkMatrix(h.w_k, `${f}.w_k`, d, dk, "d×d_k");
    dv = checkMatrix(h.w_v, `${f}.w_v`, d, dv, "d×d_v")[0].length;
    checkVector(h.b_q, `${f}.b_q`, dk, 0);
    checkVector(h.b_k, `${f}.b_k`, dk, 0);
    checkVector(h.b_v, `${f}.b_v`, dv, 0);
  });
  checkMatrix(p.w_o, `${field}.w_o`, p.heads.length * dv, d, `(H·d_v)×d with H=${p.heads.length}, d_v=${dv}`);
  checkVector(p.b_o, `${field}.b_o`, d, 0);
}

// ---- running a document ----------------------------------------------------------------------------------

// -inf (a masked score) -> null, as JSON has no infinity
function plainJson(a) {
  return a.map((row) => row.map((x) => (Number.isFinite(x) ? x : null)));
}

// Concat(H_1..H_H) W^O + b_o with H_r = softmax(Q_r K_r^T / sqrt(d_k) + M) V_r; switched-off heads give zeros
function traceMultiHead(xq, xkv, p, visible, scale, disabled = []) {
  const heads = [], parts = [];
  p.heads.forEach((h, r) => {
    const dk = h.w_q[0].length, dv = h.w_v[0].length;
    const q = addRow(matmul(xq, h.w_q), h.b_q ?? new Array(dk).fill(0));
    const k = addRow(matmul(xkv, h.w_k), h.b_k ?? new Array(dk).fill(0));
    const v = addRow(matmul(xkv, h.w_v), h.b_v ?? new Array(dv).fill(0));
    const head = { q, k, v, ...attention(q, k, v, { visible, scale }) };
    heads.push(head);
    parts.push(disabled.includes(r) ? head.output.map((row) => row.map(() => 0)) : head.output);
  });
  const concat = parts[0].map((_, i) => parts.flatMap((part) => part[i]));   // (n, H d_v)
  const output = addRow(matmul(concat, p.w_o), p.b_o ?? new Array(p.w_o[0].length).fill(0));
  return {
    heads: heads.map((head, r) => ({
      q: head.q, k: head.k, v: head.v, scores: head.scores, scaled_scores: plainJson(head.scaled_scores),
      weights: head.weights, output: head.output, disabled: disabled.includes(r),
    })),
    concat, output,
  };
}

// ReLU(x W_1 + b_1) W_2 + b_2, row by row
function traceFfn(x, p) {
  const hidden = addRow(matmul(x, p.w_1), p.b_1 ?? new Array(p.w_1[0].length).fill(0)).map((row) => row.map((v) => Math.max(v, 0)));
  return { hidden, output: addRow(matmul(hidden, p.w_2), p.b_2 ?? new Array(p.w_2[0].length).fill(0)) };
}

function runAttentionTrace(doc) {
  const q = checkMatrix(doc.q, "q");
  const k = checkMatrix(doc.k, "k", null, q[0].length, "m×d_k, d_k from q");
  const v = checkMatrix(doc.v, "v", k.length, null, "m×d_v, m from k");
  const head = attention(q, k, v, { visible: visibility(doc, q.length, k.length), scale: doc.scale ?? true });
  return { version: 1, kind: "attention", scores: head.scores, scaled_scores: plainJson(head.scaled_scores),
    weights: head.weights, output: head.output };
}

function runBlockTrace(doc) {
  const kind = doc.kind, names = TRACE_SUBLAYERS[kind];
  let x = checkMatrix(doc.x, "x");
  const n = x.length, d = x[0].length;
  const scale = doc.scale ?? true, eps = doc.eps ?? 1e-5, norm = doc.norm ?? "post";
  if (norm !== "post" && norm !== "pre") throw specError("norm", `expected "post" or "pre", got ${JSON.stringify(norm)}`);
  if (typeof eps !== "number" || !(eps >= 0)) throw specError("eps", "must be a non-negative number");
  checkHeads(doc.self_attention, "self_attention", d);
  if (!doc.ffn) throw specError("ffn", "missing required key 'ffn'");
  const dff = checkMatrix(doc.ffn.w_1, "ffn.w_1", d, null, "d×d_ff")[0].length;
  checkMatrix(doc.ffn.w_2, "ffn.w_2", dff, d, "d_ff×d");
  checkVector(doc.ffn.b_1, "ffn.b_1", dff, 0);
  checkVector(doc.ffn.b_2, "ffn.b_2", d, 0);
  if (n * dff > TRACE_LIMITS.elements) throw specError("ffn.w_1", `hidden n×d_ff = ${n * dff}, over the limit of ${TRACE_LIMITS.elements}`);
  const norms = doc.layer_norms ?? names.map(() => ({}));
  if (!Array.isArray(norms) || norms.length !== names.length) {
    throw specError("layer_norms", `expected ${names.length} (one per sub-layer of ${kind})`);
  }
  const heads = doc.self_attention.heads.length;
  const disabled = doc.disabled_heads ?? [];
  disabled.forEach((h, i) => {
    if (!Number.isInteger(h) || h < 0 || h >= heads) throw specError(`disabled_heads[${i}]`, `head ${h} out of range 0..${heads - 1} (H=${heads})`);
  });
  const selfVisible = visibility(doc, n, n);
  let memory = null, crossVisible = null;
  if (kind === "decoder_block") {
    memory = checkMatrix(doc.memory, "memory", null, d, "m×d, d from x");
    checkHeads(doc.cross_attention, "cross_attention", d);
    const pad = doc.memory_padding == null ? memory.map(() => false) : checkFlags(doc.memory_padding, "memory_padding", memory.length);
    crossVisible = Array.from({ length: n }, () => pad.map((p) => !p));  // no triangle
  }
  const result = { version: 1, kind };
  const sublayers = [];
  names.forEach((name, s) => {
    const gamma = checkVector(norms[s].gamma, `layer_norms[${s}].gamma`, d, 1);
    const beta = checkVector(norms[s].beta, `layer_norms[${s}].beta`, d, 0);
    const input = x;
    const normedIn = norm === "pre" ? layerNorm(x, gamma, beta, eps) : x;
    let part;
    if (name === "self_attention") part = traceMultiHead(normedIn, normedIn, doc.self_attention, selfVisible, scale, disabled);
    else if (name === "cross_attention") part = traceMultiHead(normedIn, memory, doc.cross_attention, crossVisible, scale);
    else part = traceFfn(normedIn, doc.ffn);
    const residual = addMatrix(input, part.output);
    let normed;
    if (norm === "post") {                                               // LN(x + Sub(x))
      normed = layerNorm(residual, gamma, beta, eps);
      x = normed;
    } else {                                                             // x + Sub(LN(x))
      normed = normedIn;
      x = residual;
    }
    result[name] = part;
    sublayers.push({ name, input, residual, normed });
  });
  result.sublayers = sublayers;
  result.output = x;
  return result;
}

// A trace-spec v1 document -> every intermediate (the JSON of lesson/reference.py run_reference)
export function runTrace(doc) {
  if (!doc || typeof doc !== "object" || Array.isArray(doc)) throw specError("spec", "expected a JSON object");
  if (doc.version !== 1) throw specError("version", `expected 1, got ${JSON.stringify(doc.version)}`);
  if (doc.kind === "attention") return runAttentionTrace(doc);
  if (doc.kind in TRACE_SUBLAYERS) return runBlockTrace(doc);
  throw specError("kind", `expected one of attention, encoder_block, decoder_block, got ${JSON.stringify(doc.kind)}`);
}

// ---- the lesson's documents ---------------------------------------------------------------------------------

// The BLOCK (lesson/examples.py): 3 rows, d = 4, 2 heads, d_k = d_v = 2, d_ff = 6
export function blockSpec(norm = "post") {
  return {
    version: 1,
    kind: "encoder_block",
    x: [[1, 0, 1, 0], [0, 1, 0, 2], [1, 1, 0, 1]],
    self_attention: {
      heads: [
        { w_q: [[1, 0], [0, 1], [0, 0], [0, 0]], w_k: [[1, 0], [0, 1], [0, 0], [0, 0]], w_v: [[0, 0], [0, 0], [1, 0], [0, 1]] },
        { w_q: [[0, 0], [0, 0], [1, 0], [0, 1]], w_k: [[0, 1], [1, 0], [0, 0], [0, 0]], w_v: [[1, 0], [0, 1], [0, 0], [0, 0]] },
      ],
      w_o: [[1, 0, 1, 0], [0, 1, 0, 1], [1, 0, -1, 0], [0, 1, 0, -1]],
    },
    ffn: {
      w_1: [[1, 0, 0, 0, 1, -1], [0, 1, 0, 0, -1, 1], [0, 0, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0]],
      w_2: [[0.5, 0, 0, 0], [0, 0.5, 0, 0], [0, 0, 0.5, 0], [0, 0, 0, 0.5], [0, 0, 0.25, 0], [0, 0, 0, 0.25]],
      activation: "relu",
    },
    norm,
    eps: 1e-5,
    scale: true,
    mask: "none",
  };
}

// The 2x3 exercise: two queries read three keys and values (the lesson's numbers are unscaled)
export function exerciseSpec(scale = false) {
  return { version: 1, kind: "attention", q: [[1, 0], [0, 1]], k: [[1, 0], [0, 1], [1, 1]], v: [[2, 0], [0, 4], [1, 2]], scale };
}

// the same JSON with every number to the lesson's six decimals
export function round6(value) {
  if (Array.isArray(value)) return value.map(round6);
  if (value && typeof value === "object") return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, round6(v)]));
  if (typeof value === "number") {
    const r = Math.round(value * 1e6) / 1e6;
    return Object.is(r, -0) ? 0 : r;
  }
  return value;
}
