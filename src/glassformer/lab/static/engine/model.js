// The lesson's Transformer in float64, as glassformer/model/ writes it, forward and backward:
//
//     X = token embedding x sqrt(d) + position vector
//     head_r = softmax(Q_r K_r^T / sqrt(d_k) + M) V_r       Q = X W^Q, K = X W^K, V = X W^V
//     MultiHead(X) = Concat(head_1, ..., head_H) W^O
//     post-norm sub-layer: LN(x + Sub(x))        pre-norm: x + Sub(LN(x))
//     FFN(x) = ReLU(x W_1 + b_1) W_2 + b_2
//
// Encoder layer: self-attention, FFN. Decoder layer: masked self-attention, cross-attention to the encoder
// output H, FFN. Every intermediate passes a probe (docs/probes.md names): `at(name, value)` records it and
// lets an intervention replace it. Values are one sentence's Matrix {rows, cols, data} (row-major float64).
// Weights keep PyTorch's nn.Linear layout (out, in): y = x W^T + b.
//
// Reverse mode: when a pass runs with a Tape, each op pushes its backward (written right below its forward,
// the formula in a comment) onto the tape; tape.backward() runs them last to first. A backward reads its
// output's gradient dy = dL/dy and ADDS its inputs' gradients (a value used twice gets both). Without a tape
// the forward does no extra work.

// ---- matrices ----------------------------------------------------------------------------------------

export function matrix(rows, cols, data = new Float64Array(rows * cols)) {
  return { rows, cols, data };
}

export function copyMatrix(m) {
  return matrix(m.rows, m.cols, Float64Array.from(m.data));
}

// A new (rows, cols) Matrix of zeros; on a tape, carved out of the tape's own memory (a pass allocates a few
// large blocks instead of hundreds of small arrays)
function valueMatrix(rows, cols, tape) {
  return matrix(rows, cols, tape ? tape.alloc(rows * cols) : new Float64Array(rows * cols));
}

// ---- the tape (reverse mode) -------------------------------------------------------------------------

const BLOCK = 1 << 15;                   // numbers in one block of a tape's memory (256 KiB)

// The ops of one forward pass, in order, and the gradients they fill: dL/d(value) of every Matrix that
// took part (`grad(m)`), and dL/d(weight) of every weight tensor {shape, data} (`weightGrad(t)`, only
// when `weights` is true: attribution asks for the inputs' gradients alone and skips them).
// `weightGrads`: a Map shared by several tapes (a batch's sentences) sums their weights' gradients.
export class Tape {
  constructor({ weights = true, weightGrads = new Map() } = {}) {
    this.ops = [];                       // backward closures, in forward order
    this.weights = weights;
    this.grads = new Map();              // Matrix -> Float64Array: dL/d(that value)
    this.weightGrads = weightGrads;      // weight tensor -> Float64Array (a tied tensor is one key: it adds)
    this.block = null;                   // the memory the pass's values and gradients are carved from
    this.used = 0;
  }

  // n zeros of this pass's memory (blocks of BLOCK numbers; a large request gets an array of its own)
  alloc(n) {
    if (n > BLOCK / 4) return new Float64Array(n);
    if (!this.block || this.used + n > BLOCK) {
      this.block = new Float64Array(BLOCK);
      this.used = 0;
    }
    this.used += n;
    return this.block.subarray(this.used - n, this.used);
  }

  push(backward) {
    this.ops.push(backward);
  }

  // dL/dm, created as zeros on first use
  grad(m) {
    let g = this.grads.get(m);
    if (!g) {
      g = this.alloc(m.data.length);
      this.grads.set(m, g);
    }
    return g;
  }

  // dL/dm when anything reached m, else null (an op whose output got no gradient is skipped)
  gradIf(m) {
    return this.grads.get(m) || null;
  }

  // dL/dW of a weight tensor. Tied matrices (the target embedding and the vocabulary head; shared source and
  // target embeddings) are one tensor, so their gradients ADD here, whichever op comes first.
  weightGrad(t) {
    let g = this.weightGrads.get(t);
    if (!g) {
      g = new Float64Array(t.data.length);
      this.weightGrads.set(t, g);
    }
    return g;
  }

  // run every backward, last op first, from dL/d(output) = seed (a Matrix or Float64Array shaped as output)
  backward(output, seed) {
    this.grad(output).set(seed.data || seed);
    for (let i = this.ops.length - 1; i >= 0; i--) this.ops[i]();
  }

  // every gradient back to zero (a second backward over the same forward: another row, another objective)
  zero() {
    for (const g of this.grads.values()) g.fill(0);
    for (const g of this.weightGrads.values()) g.fill(0);
  }
}

// x (n, in) -> x W^T + b (n, out); weight (out, in) as nn.Linear stores it. Blocks of four rows and two outputs:
// each weight row and each input row is read once for several dot products (the same sums, in the same order,
// as one row and one output at a time).
export function linear(x, weight, bias, tape) {
  const [out, inp] = weight.shape;
  if (x.cols !== inp) throw new Error(`linear: input has ${x.cols} columns, the weight expects ${inp}`);
  const n = x.rows, y = valueMatrix(n, out, tape);
  const w = weight.data, xd = x.data, yd = y.data;
  const b = bias ? bias.data : null;
  let i = 0;
  for (; i + 4 <= n; i += 4) {
    const x0 = i * inp, x1 = x0 + inp, x2 = x1 + inp, x3 = x2 + inp;
    const y0 = i * out, y1 = y0 + out, y2 = y1 + out, y3 = y2 + out;
    let o = 0;
    for (; o + 2 <= out; o += 2) {                                      // outputs o and o + 1 of rows i .. i + 3
      const wa = o * inp, wb = wa + inp;
      let a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0;
      for (let k = 0; k < inp; k++) {
        const u = w[wa + k], v = w[wb + k];
        const p0 = xd[x0 + k], p1 = xd[x1 + k], p2 = xd[x2 + k], p3 = xd[x3 + k];
        a0 += p0 * u; a1 += p1 * u; a2 += p2 * u; a3 += p3 * u;
        b0 += p0 * v; b1 += p1 * v; b2 += p2 * v; b3 += p3 * v;
      }
      if (b) {
        const ba = b[o], bb = b[o + 1];
        a0 += ba; a1 += ba; a2 += ba; a3 += ba; b0 += bb; b1 += bb; b2 += bb; b3 += bb;
      }
      yd[y0 + o] = a0; yd[y1 + o] = a1; yd[y2 + o] = a2; yd[y3 + o] = a3;
      yd[y0 + o + 1] = b0; yd[y1 + o + 1] = b1; yd[y2 + o + 1] = b2; yd[y3 + o + 1] = b3;
    }
    for (; o < out; o++) {
      const wo = o * inp;
      let s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (let k = 0; k < inp; k++) {
        const wk = w[wo + k];
        s0 += xd[x0 + k] * wk; s1 += xd[x1 + k] * wk; s2 += xd[x2 + k] * wk; s3 += xd[x3 + k] * wk;
      }
      const bo = b ? b[o] : 0;
      yd[y0 + o] = b ? s0 + bo : s0; yd[y1 + o] = b ? s1 + bo : s1;
      yd[y2 + o] = b ? s2 + bo : s2; yd[y3 + o] = b ? s3 + bo : s3;
    }
  }
  for (; i < n; i++) {
    const xi = i * inp;
    for (let o = 0; o < out; o++) {
      const wo = o * inp;
      let sum = 0;
      for (let k = 0; k < inp; k++) sum += xd[xi + k] * w[wo + k];
      yd[i * out + o] = b ? sum + b[o] : sum;
    }
  }
  if (tape) tape.push(() => linearBackward(tape, x, weight, bias, y));
  return y;
}

// y = x W^T + b:    dx = dy W    (n, out)(out, in)      dW += dy^T x    (out, n)(n, in)      db += sum_i dy_i
// In blocks of four rows and two outputs, as the forward; a block whose dy entries are all zero is skipped (a row
// the objective does not reach costs nothing).
function linearBackward(tape, x, weight, bias, y) {
  const dy = tape.gradIf(y);
  if (!dy) return;
  const [out, inp] = weight.shape, n = x.rows, w = weight.data, xd = x.data;
  const dx = tape.grad(x);
  let i = 0;
  for (; i + 4 <= n; i += 4) {                                          // dx_i += sum_o dy_io W_o
    const x0 = i * inp, x1 = x0 + inp, x2 = x1 + inp, x3 = x2 + inp;
    const y0 = i * out, y1 = y0 + out, y2 = y1 + out, y3 = y2 + out;
    let o = 0;
    for (; o + 2 <= out; o += 2) {
      const g0 = dy[y0 + o], g1 = dy[y1 + o], g2 = dy[y2 + o], g3 = dy[y3 + o];
      const h0 = dy[y0 + o + 1], h1 = dy[y1 + o + 1], h2 = dy[y2 + o + 1], h3 = dy[y3 + o + 1];
      if (g0 === 0 && g1 === 0 && g2 === 0 && g3 === 0 && h0 === 0 && h1 === 0 && h2 === 0 && h3 === 0) continue;
      const wa = o * inp, wb = wa + inp;
      for (let k = 0; k < inp; k++) {
        const u = w[wa + k], v = w[wb + k];
        dx[x0 + k] += g0 * u + h0 * v;
        dx[x1 + k] += g1 * u + h1 * v;
        dx[x2 + k] += g2 * u + h2 * v;
        dx[x3 + k] += g3 * u + h3 * v;
      }
    }
    for (; o < out; o++) {
      const g0 = dy[y0 + o], g1 = dy[y1 + o], g2 = dy[y2 + o], g3 = dy[y3 + o];
      if (g0 === 0 && g1 === 0 && g2 === 0 && g3 === 0) continue;
      const wo = o * inp;
      for (let k = 0; k < inp; k++) {
        const wk = w[wo + k];
        dx[x0 + k] += g0 * wk; dx[x1 + k] += g1 * wk; dx[x2 + k] += g2 * wk; dx[x3 + k] += g3 * wk;
      }
    }
  }
  for (; i < n; i++) {
    const xi = i * inp;
    for (let o = 0; o < out; o++) {
      const g = dy[i * out + o];
      if (g === 0) continue;
      const wo = o * inp;
      for (let k = 0; k < inp; k++) dx[xi + k] += g * w[wo + k];
    }
  }
  if (!tape.weights) return;
  const dw = tape.weightGrad(weight);
  let o = 0;
  for (; o + 2 <= out; o += 2) {                                        // dW_o += sum_i dy_io x_i
    const wa = o * inp, wb = wa + inp;
    let r = 0;
    for (; r + 4 <= n; r += 4) {
      const ya = r * out + o;
      const g0 = dy[ya], g1 = dy[ya + out], g2 = dy[ya + 2 * out], g3 = dy[ya + 3 * out];
      const h0 = dy[ya + 1], h1 = dy[ya + out + 1], h2 = dy[ya + 2 * out + 1], h3 = dy[ya + 3 * out + 1];
      if (g0 === 0 && g1 === 0 && g2 === 0 && g3 === 0 && h0 === 0 && h1 === 0 && h2 === 0 && h3 === 0) continue;
      const x0 = r * inp, x1 = x0 + inp, x2 = x1 + inp, x3 = x2 + inp;
      for (let k = 0; k < inp; k++) {
        const p0 = xd[x0 + k], p1 = xd[x1 + k], p2 = xd[x2 + k], p3 = xd[x3 + k];
        dw[wa + k] += g0 * p0 + g1 * p1 + g2 * p2 + g3 * p3;
        dw[wb + k] += h0 * p0 + h1 * p1 + h2 * p2 + h3 * p3;
      }
    }
    for (; r < n; r++) {
      const g = dy[r * out + o], h = dy[r * out + o + 1];
      if (g === 0 && h === 0) continue;
      const xr = r * inp;
      for (let k = 0; k < inp; k++) {
        dw[wa + k] += g * xd[xr + k];
        dw[wb + k] += h * xd[xr + k];
      }
    }
  }
  for (; o < out; o++) {
    const wo = o * inp;
    for (let r = 0; r < n; r++) {
      const g = dy[r * out + o];
      if (g === 0) continue;
      const xr = r * inp;
      for (let k = 0; k < inp; k++) dw[wo + k] += g * xd[xr + k];
    }
  }
  if (bias) {
    const db = tape.weightGrad(bias);
    for (let r = 0; r < n; r++) for (let c = 0; c < out; c++) db[c] += dy[r * out + c];
  }
}

// a + b:    da += dy,  db += dy (the residual path carries the gradient past the sub-layer unchanged)
export function addMatrices(a, b, tape) {
  const out = valueMatrix(a.rows, a.cols, tape);
  for (let i = 0; i < out.data.length; i++) out.data[i] = a.data[i] + b.data[i];
  if (tape) {
    tape.push(() => {
      const dy = tape.gradIf(out);
      if (!dy) return;
      const da = tape.grad(a), db = tape.grad(b);
      for (let i = 0; i < dy.length; i++) {
        da[i] += dy[i];
        db[i] += dy[i];
      }
    });
  }
  return out;
}

// LayerNorm over the d features of each row: gamma * (x - mean) / sqrt(var + eps) + beta (population variance)
export function layerNormRows(x, norm, eps, tape) {
  const d = x.cols, y = valueMatrix(x.rows, d, tape);
  const gamma = norm.weight.data, beta = norm.bias.data;
  const xhat = tape ? tape.alloc(x.data.length) : null;          // kept for the backward
  const rstd = tape ? tape.alloc(x.rows) : null;
  for (let i = 0; i < x.rows; i++) {
    const row = x.data.subarray(i * d, (i + 1) * d);
    let mean = 0;
    for (let k = 0; k < d; k++) mean += row[k];
    mean /= d;
    let variance = 0;
    for (let k = 0; k < d; k++) variance += (row[k] - mean) * (row[k] - mean);
    variance /= d;
    const inv = 1 / Math.sqrt(variance + eps);
    for (let k = 0; k < d; k++) y.data[i * d + k] = (row[k] - mean) * inv * gamma[k] + beta[k];
    if (tape) {
      rstd[i] = inv;
      for (let k = 0; k < d; k++) xhat[i * d + k] = (row[k] - mean) * inv;
    }
  }
  if (tape) tape.push(() => layerNormBackward(tape, x, norm, y, xhat, rstd));
  return y;
}

// y = gamma * xhat + beta, xhat = (x - mean) * rstd, rstd = 1 / sqrt(var + eps), per row of d features
// (llm.c's layernorm.md):   dbeta += dy     dgamma += dy * xhat     dxhat = dy * gamma
//     dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
// the two means are the mean's and the variance's own gradients: every x_k moves the mean and the variance
// of its row, so each input feels every output of the row.
function layerNormBackward(tape, x, norm, y, xhat, rstd) {
  const dy = tape.gradIf(y);
  if (!dy) return;
  const d = x.cols, gamma = norm.weight.data, dx = tape.grad(x);
  const dgamma = tape.weights ? tape.weightGrad(norm.weight) : null;
  const dbeta = tape.weights ? tape.weightGrad(norm.bias) : null;
  for (let i = 0; i < x.rows; i++) {
    const at = i * d;
    let meanD = 0, meanDX = 0;                                          // mean(dxhat), mean(dxhat * xhat)
    for (let k = 0; k < d; k++) {
      const dxhat = dy[at + k] * gamma[k];
      meanD += dxhat;
      meanDX += dxhat * xhat[at + k];
      if (dgamma) {
        dgamma[k] += dy[at + k] * xhat[at + k];
        dbeta[k] += dy[at + k];
      }
    }
    meanD /= d;
    meanDX /= d;
    for (let k = 0; k < d; k++) {
      const dxhat = dy[at + k] * gamma[k];
      dx[at + k] += rstd[i] * (dxhat - meanD - xhat[at + k] * meanDX);
    }
  }
}

// ---- positions ---------------------------------------------------------------------------------------

// (n, d): PE(p, 2r) = sin(p / 10000^(2r/d)), PE(p, 2r+1) = cos(p / 10000^(2r/d)); "halves": [sines | cosines]
export function sinusoidalPositions(n, d, layout = "interleaved") {
  const table = matrix(n, d);
  const half = Math.ceil(d / 2);
  for (let p = 0; p < n; p++) {
    for (let r = 0; r < half; r++) {
      const angle = p / Math.pow(10000, (2 * r) / d);
      const sinAt = layout === "halves" ? r : 2 * r;
      const cosAt = layout === "halves" ? half + r : 2 * r + 1;
      table.data[p * d + sinAt] = Math.sin(angle);
      if (2 * r + 1 < d) table.data[p * d + cosAt] = Math.cos(angle);
    }
  }
  return table;
}

// RoPE: rotate each pair (2r, 2r+1) of a head's q or k row at absolute position p by p * base^(-2r/d_k)
export function rotate(x, firstPosition, base, tape) {
  const dk = x.cols, out = valueMatrix(x.rows, dk, tape);
  const cos = tape ? tape.alloc(x.rows * (dk / 2)) : null, sin = tape ? tape.alloc(cos.length) : null;
  for (let i = 0; i < x.rows; i++) {
    const p = firstPosition + i;
    for (let r = 0; r < dk / 2; r++) {
      const angle = p * Math.pow(base, -(2 * r) / dk);
      const c = Math.cos(angle), s = Math.sin(angle);
      const even = x.data[i * dk + 2 * r], odd = x.data[i * dk + 2 * r + 1];
      out.data[i * dk + 2 * r] = even * c - odd * s;
      out.data[i * dk + 2 * r + 1] = even * s + odd * c;
      if (tape) {
        cos[i * (dk / 2) + r] = c;
        sin[i * (dk / 2) + r] = s;
      }
    }
  }
  // a rotation's transpose undoes it:  d_even = dy_even c + dy_odd s,   d_odd = -dy_even s + dy_odd c
  if (tape) {
    tape.push(() => {
      const dy = tape.gradIf(out);
      if (!dy) return;
      const dx = tape.grad(x);
      for (let i = 0; i < x.rows; i++) {
        for (let r = 0; r < dk / 2; r++) {
          const c = cos[i * (dk / 2) + r], s = sin[i * (dk / 2) + r];
          const de = dy[i * dk + 2 * r], dod = dy[i * dk + 2 * r + 1];
          dx[i * dk + 2 * r] += de * c + dod * s;
          dx[i * dk + 2 * r + 1] += -de * s + dod * c;
        }
      }
    });
  }
  return out;
}

// ---- masks (1 = may attend) --------------------------------------------------------------------------

// (query, key): query i (absolute position offset + i) may see key j iff j <= offset + i
export function causalMask(nQuery, nKey, offset = 0) {
  const mask = matrix(nQuery, nKey);
  for (let i = 0; i < nQuery; i++) {
    for (let j = 0; j < nKey; j++) mask.data[i * nKey + j] = j <= offset + i ? 1 : 0;
  }
  return mask;
}

// (query, key) from the keys' PAD flags: every query sees every key that is not PAD
export function paddingMask(nQuery, keyIsPad) {
  const nKey = keyIsPad.length, mask = matrix(nQuery, nKey);
  for (let i = 0; i < nQuery; i++) {
    for (let j = 0; j < nKey; j++) mask.data[i * nKey + j] = keyIsPad[j] ? 0 : 1;
  }
  return mask;
}

export function combineMasks(a, b) {
  if (!a) return b;
  if (!b) return a;
  const out = matrix(a.rows, a.cols);
  for (let i = 0; i < out.data.length; i++) out.data[i] = a.data[i] && b.data[i] ? 1 : 0;
  return out;
}

// ---- probes ------------------------------------------------------------------------------------------

// fnmatch as Python's: `*` any run of characters (dots too), `?` one character
export function globToRegExp(pattern) {
  const escaped = pattern.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".");
  return new RegExp(`^${escaped}$`);
}

function zerosLike(value) {
  return matrix(value.rows, value.cols);
}

// What one pass records and replaces: `at(name, value)` is every hook point. opts.tape: the pass is kept for
// reverse mode; opts.keep: probe names whose value (after any replacement, the very Matrix the model goes on
// with, not a copy) is kept in `kept`, so its gradient can be read after the backward.
export class ProbeContext {
  constructor(names, opts = {}) {
    this.probes = new Map();
    this.kept = new Map();
    this.tape = opts.tape || null;
    this.decisions = new Map();                       // name -> {record, keep, fns} (worked out once per name)
    this.recordAll = opts.record === true;
    this.recordPatterns = Array.isArray(opts.record) ? opts.record.map(globToRegExp) : [];
    this.keepNames = new Set((opts.keep || []).filter((name) => !/[*?[]/.test(name)));   // exact names: no pattern
    this.keepPatterns = (opts.keep || []).filter((name) => !this.keepNames.has(name)).map(globToRegExp);
    this.interventions = [];                          // [RegExp, fn], in order
    for (const head of opts.off || []) {
      if (!/^(encoder|decoder)\.\d+\.(self|cross)_attention\.head\.\d+$/.test(head) || !names.has(`${head}.output`)) {
        throw new Error(`off: no head ${JSON.stringify(head)} in this model (a head's probe name without .output, ` +
                        `e.g. decoder.1.cross_attention.head.0)`);
      }
      this.interventions.push([globToRegExp(`${head}.output`), zerosLike]);
    }
    for (const [pattern, fn] of Object.entries(opts.intervene || {})) {
      const regexp = globToRegExp(pattern);
      if (![...names].some((name) => regexp.test(name))) throw new Error(`intervene: no probe matches ${pattern}`);
      if (typeof fn !== "function") throw new Error(`intervene: ${pattern}: expected a function (value, name) -> value`);
      this.interventions.push([regexp, fn]);
    }
    this.idle = !this.recordAll && this.recordPatterns.length === 0 && this.interventions.length === 0 &&
      this.keepPatterns.length === 0 && this.keepNames.size === 0;
    this.keepOnly = !this.idle && !this.recordAll && this.recordPatterns.length === 0 && this.interventions.length === 0 &&
      this.keepPatterns.length === 0;                 // only exact names kept: a Set lookup per hook point
  }

  decision(name) {
    let d = this.decisions.get(name);
    if (!d) {
      d = {
        record: this.recordAll || this.recordPatterns.some((r) => r.test(name)),
        keep: this.keepNames.has(name) || this.keepPatterns.some((r) => r.test(name)),
        fns: this.interventions.filter(([r]) => r.test(name)).map(([, fn]) => fn),
      };
      this.decisions.set(name, d);
    }
    return d;
  }

  // the value at hook point `name`: recorded (a copy, before any replacement), then replaced in order. A
  // replacement is a new leaf for the backward: the gradient stops there (a switched-off head passes none back).
  at(name, value) {
    if (this.idle) return value;
    if (this.keepOnly) {
      if (this.keepNames.has(name)) this.kept.set(name, value);
      return value;
    }
    const d = this.decision(name);
    if (d.record) this.probes.set(name, copyMatrix(value));
    for (const fn of d.fns) {
      const out = fn(value, name);
      if (out === undefined || out === null) continue;
      if (out.rows !== value.rows || out.cols !== value.cols || out.data.length !== value.data.length) {
        throw new Error(`intervene: ${name} returned (${out.rows}, ${out.cols}), expected (${value.rows}, ${value.cols})`);
      }
      value = out;
    }
    if (d.keep) this.kept.set(name, value);
    return value;
  }

  // whether anything is attached at `name` (a mask is only built as a probe value when asked)
  wants(name) {
    if (this.idle) return false;
    const d = this.decision(name);
    return d.record || d.fns.length > 0;
  }
}

// ---- attention ---------------------------------------------------------------------------------------

// head h's columns h*width .. (h+1)*width of x (rows, H width) -> (rows, width);  backward: dx[:, head h] += dy
function headColumns(x, h, width, tape) {
  const out = valueMatrix(x.rows, width, tape);
  for (let i = 0; i < x.rows; i++) {
    for (let c = 0; c < width; c++) out.data[i * width + c] = x.data[i * x.cols + h * width + c];
  }
  if (tape) {
    tape.push(() => {
      const dy = tape.gradIf(out);
      if (!dy) return;
      const dx = tape.grad(x);
      for (let i = 0; i < x.rows; i++) {
        for (let c = 0; c < width; c++) dx[i * x.cols + h * width + c] += dy[i * width + c];
      }
    });
  }
  return out;
}

// scores = q k^T (query, key);   backward: dq += dscores k,   dk += dscores^T q
function queryKeyScores(q, k, tape) {
  const n = q.rows, m = k.rows, dk = q.cols;
  const scores = valueMatrix(n, m, tape);
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < m; j++) {
      let sum = 0;
      for (let c = 0; c < dk; c++) sum += q.data[i * dk + c] * k.data[j * dk + c];
      scores.data[i * m + j] = sum;
    }
  }
  if (tape) {
    tape.push(() => {
      const ds = tape.gradIf(scores);
      if (!ds) return;
      const dq = tape.grad(q), dkey = tape.grad(k);
      for (let i = 0; i < n; i++) {
        for (let j = 0; j < m; j++) {
          const g = ds[i * m + j];
          if (g === 0) continue;
          for (let c = 0; c < dk; c++) {
            dq[i * dk + c] += g * k.data[j * dk + c];
            dkey[j * dk + c] += g * q.data[i * dk + c];
          }
        }
      }
    });
  }
  return scores;
}

// scaled = scores / sqrt(d_k) (when `scale`; root = sqrt(d_k)) + bias b_{i-j} (relative positions), -inf where masked
// backward: dscores = dscaled / sqrt(d_k),  dbias += dscaled  (a masked entry gets nothing: its weight is 0)
function scaleAndMask(scores, scale, root, bias, visible, tape) {
  const n = scores.rows, m = scores.cols;
  const scaled = valueMatrix(n, m, tape);
  for (let i = 0; i < n * m; i++) {
    let s = scale ? scores.data[i] / root : scores.data[i];
    if (bias) s += bias.data[i];                                         // relative bias b_{i-j}
    scaled.data[i] = visible && !visible.data[i] ? -Infinity : s;
  }
  if (tape) {
    tape.push(() => {
      const dz = tape.gradIf(scaled);
      if (!dz) return;
      const ds = tape.grad(scores), db = bias ? tape.grad(bias) : null;
      for (let i = 0; i < n * m; i++) {
        if (visible && !visible.data[i]) continue;                      // -inf: no path back
        ds[i] += scale ? dz[i] / root : dz[i];
        if (db) db[i] += dz[i];
      }
    });
  }
  return scaled;
}

// softmax of each row over its visible keys; a row with none gets zeros (never NaN)
export function softmaxOverKeys(scaled, visible, tape) {
  const n = scaled.rows, m = scaled.cols, weights = valueMatrix(n, m, tape);
  for (let i = 0; i < n; i++) {
    let top = -Infinity, seen = false;
    for (let j = 0; j < m; j++) {
      if (visible && !visible.data[i * m + j]) continue;
      seen = true;
      if (scaled.data[i * m + j] > top) top = scaled.data[i * m + j];
    }
    if (!seen) continue;
    let total = 0;
    for (let j = 0; j < m; j++) {
      if (visible && !visible.data[i * m + j]) continue;
      const e = Math.exp(scaled.data[i * m + j] - top);
      weights.data[i * m + j] = e;
      total += e;
    }
    for (let j = 0; j < m; j++) weights.data[i * m + j] /= total;
  }
  if (tape) tape.push(() => softmaxBackward(tape, scaled, weights));
  return weights;
}

// p = softmax(z) of one row: dp_j/dz_k = p_j ([j = k] - p_k), the Jacobian diag(p) - p p^T, so
//     dz = p * (dp - sum_k p_k dp_k)            (the sum is the -p p^T term)
// A masked key (p = 0) and a row with no visible key (all p = 0) get dz = 0, never NaN.
function softmaxBackward(tape, scaled, weights) {
  const dp = tape.gradIf(weights);
  if (!dp) return;
  const n = scaled.rows, m = scaled.cols, p = weights.data, dz = tape.grad(scaled);
  for (let i = 0; i < n; i++) {
    let dot = 0;
    for (let j = 0; j < m; j++) dot += p[i * m + j] * dp[i * m + j];
    for (let j = 0; j < m; j++) dz[i * m + j] += p[i * m + j] * (dp[i * m + j] - dot);
  }
}

// out = weights v (query, d_v);   backward: dweights = dout v^T,   dv += weights^T dout
function weightedValues(weights, v, tape) {
  const n = weights.rows, m = weights.cols, dv = v.cols;
  const out = valueMatrix(n, dv, tape);                                        // (query, d_v)
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < m; j++) {
      const a = weights.data[i * m + j];
      if (a === 0) continue;
      for (let c = 0; c < dv; c++) out.data[i * dv + c] += a * v.data[j * dv + c];
    }
  }
  if (tape) {
    tape.push(() => {
      const dout = tape.gradIf(out);
      if (!dout) return;
      const dw = tape.grad(weights), dvalue = tape.grad(v);
      for (let i = 0; i < n; i++) {
        for (let j = 0; j < m; j++) {
          const a = weights.data[i * m + j];
          let sum = 0;
          for (let c = 0; c < dv; c++) {
            sum += dout[i * dv + c] * v.data[j * dv + c];
            if (a !== 0) dvalue[j * dv + c] += a * dout[i * dv + c];
          }
          dw[i * m + j] += sum;
        }
      }
    });
  }
  return out;
}

// One head: scores = q k^T (query, key); / sqrt(d_k); + bias; -inf where masked; softmax over keys; weights v.
// A query row with no visible key gets zero weights and a zero output.
export function attendHead(q, k, v, visible, scale, bias, ctx, prefix) {
  const tape = ctx.tape;
  q = ctx.at(`${prefix}.q`, q);
  k = ctx.at(`${prefix}.k`, k);
  v = ctx.at(`${prefix}.v`, v);
  const scores = ctx.at(`${prefix}.scores`, queryKeyScores(q, k, tape));                  // (query, key)
  const root = scale ? Math.sqrt(q.cols) : 1;
  const scaled = ctx.at(`${prefix}.scaled_scores`, scaleAndMask(scores, scale, root, bias, visible, tape));
  let weights = softmaxOverKeys(scaled, visible, tape);
  weights = ctx.at(`${prefix}.weights`, weights);
  return ctx.at(`${prefix}.output`, weightedValues(weights, v, tape));                  // (query, d_v)
}

// The relative bias b_{i-j} of every head (heads of (query, key)): offsets clipped to [-clip, clip]
// backward: table[h, offset] += every dbias entry with that clipped offset
function relativeBias(table, heads, clip, firstQuery, nQuery, nKey, tape) {
  const width = 2 * clip + 1;
  const offsetOf = (i, j) => Math.max(-clip, Math.min(clip, firstQuery + i - j)) + clip;
  return Array.from({ length: heads }, (_, h) => {
    const b = valueMatrix(nQuery, nKey, tape);
    for (let i = 0; i < nQuery; i++) {
      for (let j = 0; j < nKey; j++) b.data[i * nKey + j] = table.data[h * width + offsetOf(i, j)];
    }
    if (tape && tape.weights) {
      tape.push(() => {
        const db = tape.gradIf(b);
        if (!db) return;
        const dt = tape.weightGrad(table);
        for (let i = 0; i < nQuery; i++) {
          for (let j = 0; j < nKey; j++) dt[h * width + offsetOf(i, j)] += db[i * nKey + j];
        }
      });
    }
    return b;
  });
}

// Concat(head outputs) W^O + b^O: (query, H d_v) -> (query, d);  concat's backward: dhead_h = dconcat[:, head h]
function combineHeads(p, outputs, ctx, prefix) {
  const n = outputs[0].rows, dv = outputs[0].cols, heads = outputs.length, tape = ctx.tape;
  const joined = valueMatrix(n, heads * dv, tape);
  outputs.forEach((o, h) => {
    for (let i = 0; i < n; i++) {
      for (let c = 0; c < dv; c++) joined.data[i * heads * dv + h * dv + c] = o.data[i * dv + c];
    }
  });
  if (tape) {
    tape.push(() => {
      const dy = tape.gradIf(joined);
      if (!dy) return;
      outputs.forEach((o, h) => {
        const dout = tape.grad(o);
        for (let i = 0; i < n; i++) {
          for (let c = 0; c < dv; c++) dout[i * dv + c] += dy[i * heads * dv + h * dv + c];
        }
      });
    });
  }
  const concat = ctx.at(`${prefix}.concat`, joined);
  return ctx.at(`${prefix}.output`, linear(concat, p.w_o.weight, p.w_o.bias, tape));
}

// The mask probe (query, key): recorded or replaced only when something is attached
function maskProbe(visible, ctx, prefix) {
  if (!visible || !ctx.wants(`${prefix}.mask`)) return visible;
  return ctx.at(`${prefix}.mask`, visible);
}

// Self-attention: Q, K, V from the same rows x (query, d). `cache` (a layer's {k, v} per head, incremental
// decoding) holds the keys and values of earlier positions; this call's rows are written after them.
export function multiHeadAttention(model, p, x, { visible, causal, cache, offset = 0 }, ctx, prefix) {
  const cfg = model.config, H = cfg.heads, tape = ctx.tape;
  if (tape && cache) throw new Error("attention: a pass on a tape runs the whole sequence, without a KV cache");
  const Q = linear(x, p.w_q.weight, p.w_q.bias, tape);                  // (query, H d_k)
  const K = linear(x, p.w_k.weight, p.w_k.bias, tape);
  const V = linear(x, p.w_v.weight, p.w_v.bias, tape);                  // (query, H d_v)
  const n = x.rows, m = offset + n;
  if (causal && n > 1) visible = combineMasks(causalMask(n, m, offset), visible);   // one query row sees all
  visible = maskProbe(visible, ctx, prefix);
  const bias = p.relative ? relativeBias(p.relative, H, cfg.relative_clip, offset, n, m, tape) : null;
  const outputs = [];
  for (let h = 0; h < H; h++) {
    let q = headColumns(Q, h, cfg.d_k, tape), k = headColumns(K, h, cfg.d_k, tape), v = headColumns(V, h, cfg.d_v, tape);
    if (cfg.positions === "rope") {
      q = rotate(q, offset, cfg.rope_base, tape);
      k = rotate(k, offset, cfg.rope_base, tape);
    }
    if (cache) [k, v] = cache.write(h, k, v);                            // (offset + query, d_k | d_v)
    outputs.push(attendHead(q, k, v, visible, cfg.scale_scores, bias && bias[h], ctx, `${prefix}.head.${h}`));
  }
  return combineHeads(p, outputs, ctx, prefix);
}

// Cross-attention: queries from the decoder rows x, keys and values from the encoder output H (`memory`).
// `kv` (per head [k, v]) is projected once per sentence and reused by every decoding step.
export function crossAttention(model, p, x, kv, visible, ctx, prefix) {
  const cfg = model.config;
  const Q = linear(x, p.w_q.weight, p.w_q.bias, ctx.tape);              // (query, H d_k)
  visible = maskProbe(visible, ctx, prefix);
  const outputs = kv.map(([k, v], h) =>
    attendHead(headColumns(Q, h, cfg.d_k, ctx.tape), k, v, visible, cfg.scale_scores, null, ctx, `${prefix}.head.${h}`));
  return combineHeads(p, outputs, ctx, prefix);
}

export function projectMemory(model, p, memory, tape) {
  const cfg = model.config;
  const K = linear(memory, p.w_k.weight, p.w_k.bias, tape), V = linear(memory, p.w_v.weight, p.w_v.bias, tape);
  return Array.from({ length: cfg.heads }, (_, h) => [headColumns(K, h, cfg.d_k, tape), headColumns(V, h, cfg.d_v, tape)]);
}

// ---- feed-forward and sub-layers ---------------------------------------------------------------------

// each non-linearity with its derivative at the pre-activation z
const ACTIVATION = {
  relu: { f: (z) => (z > 0 ? z : 0), df: (z) => (z > 0 ? 1 : 0) },
  // silu(z) = z s, s = sigmoid(z):   silu'(z) = s (1 + z (1 - s))
  silu: { f: (z) => z / (1 + Math.exp(-z)), df: (z) => { const s = 1 / (1 + Math.exp(-z)); return s * (1 + z * (1 - s)); } },
};

// act(z) entry by entry;   backward: dz = dy * act'(z)
function activate(z, act, tape) {
  const y = valueMatrix(z.rows, z.cols, tape);
  for (let i = 0; i < y.data.length; i++) y.data[i] = act.f(z.data[i]);
  if (tape) {
    tape.push(() => {
      const dy = tape.gradIf(y);
      if (!dy) return;
      const dz = tape.grad(z);
      for (let i = 0; i < dy.length; i++) if (dy[i] !== 0) dz[i] += dy[i] * act.df(z.data[i]);
    });
  }
  return y;
}

// FFN(x) = act(x W_1 + b_1) W_2 + b_2, each row alone
export function feedForward(model, p, x, ctx, prefix) {
  const tape = ctx.tape;
  const pre = linear(x, p.w_1.weight, p.w_1.bias, tape);                // (rows, d_ff)
  const hidden = ctx.at(`${prefix}.hidden`, activate(pre, ACTIVATION[model.config.activation], tape));
  return ctx.at(`${prefix}.output`, linear(hidden, p.w_2.weight, p.w_2.bias, tape));
}

// One sub-layer's residual path and LayerNorm. post: LN(x + Sub(x)); pre: x + Sub(LN(x))
export function residualNorm(model, norm, x, sublayer, ctx, prefix) {
  const eps = model.config.eps, tape = ctx.tape;
  x = ctx.at(`${prefix}.input`, x);
  if (model.config.norm_placement === "post") {
    const residual = ctx.at(`${prefix}.residual`, addMatrices(x, sublayer(x), tape));
    return ctx.at(`${prefix}.normed`, layerNormRows(residual, norm, eps, tape));
  }
  const normed = ctx.at(`${prefix}.normed`, layerNormRows(x, norm, eps, tape));
  return ctx.at(`${prefix}.residual`, addMatrices(x, sublayer(normed), tape));
}

// U = LN(X + MHA(X)), Z = LN(U + FFN(U)) (post-norm); visible (src, src) 1 = may attend
export function encoderLayer(model, p, x, visible, ctx, prefix) {
  x = residualNorm(model, p.norms[0], x,
    (h) => multiHeadAttention(model, p.self_attention, h, { visible }, ctx, `${prefix}.self_attention`),
    ctx, `${prefix}.sublayer.0`);
  return ctx.at(`${prefix}.output`, residualNorm(model, p.norms[1], x,
    (h) => feedForward(model, p.ffn, h, ctx, `${prefix}.ffn`), ctx, `${prefix}.sublayer.1`));
}

// Masked self-attention, cross-attention to H, FFN. y: the target rows (or the newest row, with `cache`)
export function decoderLayer(model, p, y, encoded, kv, layerCache, offset, ctx, prefix) {
  y = residualNorm(model, p.norms[0], y,
    (h) => multiHeadAttention(model, p.self_attention, h, { causal: true, cache: layerCache, offset }, ctx,
      `${prefix}.self_attention`),
    ctx, `${prefix}.sublayer.0`);
  const visible = encoded.padding ? paddingMask(y.rows, encoded.padding) : null;   // no triangle on cross
  y = residualNorm(model, p.norms[1], y,
    (h) => crossAttention(model, p.cross_attention, h, kv, visible, ctx, `${prefix}.cross_attention`),
    ctx, `${prefix}.sublayer.1`);
  return ctx.at(`${prefix}.output`, residualNorm(model, p.norms[2], y,
    (h) => feedForward(model, p.ffn, h, ctx, `${prefix}.ffn`), ctx, `${prefix}.sublayer.2`));
}

// ---- the KV cache ------------------------------------------------------------------------------------

// Every decoder layer's self-attention keys and values of earlier positions, per head, in buffers that
// grow (doubling, up to max_len rows) as decoding goes on; cross-attention's K, V of the encoder output,
// projected on the first step
export class KVCache {
  constructor(config, cross = null, capacity = Math.min(config.max_len, 32)) {
    this.config = config;
    this.length = 0;                                  // target positions written so far
    this.capacity = capacity;                         // rows each buffer holds
    this.cross = cross;                               // [layer][head] -> [k, v]
    this.layers = Array.from({ length: config.decoder_layers }, () => ({
      k: Array.from({ length: config.heads }, () => new Float64Array(capacity * config.d_k)),
      v: Array.from({ length: config.heads }, () => new Float64Array(capacity * config.d_v)),
    }));
  }

  // room for `end` rows in every buffer, the rows written so far kept
  reserve(end) {
    if (end <= this.capacity) return;
    if (end > this.config.max_len) throw new Error(`decoding: ${end} target positions, over max_len ${this.config.max_len}`);
    const capacity = Math.min(this.config.max_len, Math.max(end, 2 * this.capacity));
    for (const layer of this.layers) {
      for (const [part, width] of [["k", this.config.d_k], ["v", this.config.d_v]]) {
        layer[part] = layer[part].map((buffer) => {
          const grown = new Float64Array(capacity * width);
          grown.set(buffer.subarray(0, this.length * width));
          return grown;
        });
      }
    }
    this.capacity = capacity;
  }

  // a layer's view: write head h's new rows at `length`, return rows 0 .. length + new
  layer(i) {
    const cache = this;
    return {
      write(h, k, v) {
        const end = cache.length + k.rows;
        cache.reserve(end);
        const buffers = cache.layers[i];
        buffers.k[h].set(k.data, cache.length * k.cols);
        buffers.v[h].set(v.data, cache.length * v.cols);
        return [matrix(end, k.cols, buffers.k[h].subarray(0, end * k.cols)),
          matrix(end, v.cols, buffers.v[h].subarray(0, end * v.cols))];
      },
    };
  }

  // a copy for a beam that continues this one (only the written rows are copied; cross K/V are shared)
  clone() {
    const out = new KVCache(this.config, this.cross, this.capacity);
    out.length = this.length;
    this.layers.forEach((layer, i) => {
      for (const [part, width] of [["k", this.config.d_k], ["v", this.config.d_v]]) {
        layer[part].forEach((buffer, h) => out.layers[i][part][h].set(buffer.subarray(0, this.length * width)));
      }
    });
    return out;
  }
}

// ---- the whole model ---------------------------------------------------------------------------------

const SUPPORTED_POSITIONS = ["sinusoidal", "learned", "relative", "rope", "none"];
// sizes a config may ask for, as glassformer.limits (MAX_D_MODEL, MAX_HEADS, MAX_D_FF, MAX_LAYERS, MAX_LEN, MAX_VOCAB)
const CONFIG_LIMITS = { d_model: 4096, heads: 64, d_ff: 16384, encoder_layers: 48, decoder_layers: 48, max_len: 8192,
  src_vocab: 262144, tgt_vocab: 262144 };

function tensorOf(tensors, name, shape) {
  const t = tensors.get(name);
  if (!t) throw new Error(`model bundle: tensor ${name} is missing`);
  if (t.shape.length !== shape.length || t.shape.some((n, i) => n !== shape[i])) {
    throw new Error(`model bundle: tensor ${name} has shape [${t.shape}]; the config implies [${shape}]`);
  }
  return t;
}

function linearOf(tensors, prefix, out, inp, bias) {
  return { weight: tensorOf(tensors, `${prefix}.weight`, [out, inp]), bias: bias ? tensorOf(tensors, `${prefix}.bias`, [out]) : null };
}

function normOf(tensors, prefix, d) {
  return { weight: tensorOf(tensors, `${prefix}.weight`, [d]), bias: tensorOf(tensors, `${prefix}.bias`, [d]) };
}

function attentionOf(tensors, prefix, cfg, self) {
  const qk = cfg.heads * cfg.d_k, v = cfg.heads * cfg.d_v, d = cfg.d_model;
  return {
    w_q: linearOf(tensors, `${prefix}.w_q`, qk, d, cfg.bias),
    w_k: linearOf(tensors, `${prefix}.w_k`, qk, d, cfg.bias),
    w_v: linearOf(tensors, `${prefix}.w_v`, v, d, cfg.bias),
    w_o: linearOf(tensors, `${prefix}.w_o`, d, v, cfg.bias),
    relative: self && cfg.positions === "relative"
      ? tensorOf(tensors, `${prefix}.relative.bias`, [cfg.heads, 2 * cfg.relative_clip + 1]) : null,
  };
}

function layerOf(tensors, prefix, cfg, cross) {
  const d = cfg.d_model;
  return {
    self_attention: attentionOf(tensors, `${prefix}.self_attention`, cfg, true),
    cross_attention: cross ? attentionOf(tensors, `${prefix}.cross_attention`, cfg, false) : null,
    ffn: { w_1: linearOf(tensors, `${prefix}.ffn.w_1`, cfg.d_ff, d, cfg.bias), w_2: linearOf(tensors, `${prefix}.ffn.w_2`, d, cfg.d_ff, cfg.bias) },
    norms: Array.from({ length: cross ? 3 : 2 }, (_, s) => normOf(tensors, `${prefix}.sublayer.${s}.layer_norm`, d)),
  };
}

// The config with the defaults ModelConfig fills in (d_k, d_v, final_norm)
function completeConfig(config) {
  const cfg = { ...config };
  if (cfg.family && cfg.family !== "encoder-decoder") throw new Error(`model: the page runs encoder-decoder models, not ${cfg.family}`);
  if (!SUPPORTED_POSITIONS.includes(cfg.positions)) throw new Error(`model: positions ${cfg.positions} unknown`);
  if (!(cfg.activation in ACTIVATION)) throw new Error(`model: activation ${cfg.activation} unknown`);
  for (const [key, limit] of Object.entries(CONFIG_LIMITS)) {
    if (!Number.isSafeInteger(cfg[key]) || cfg[key] < 1 || cfg[key] > limit) {
      throw new Error(`model: config ${key} must be a whole number in 1..${limit}, got ${String(cfg[key]).slice(0, 20)}`);
    }
  }
  cfg.d_k = cfg.d_k ?? Math.floor(cfg.d_model / cfg.heads);
  cfg.d_v = cfg.d_v ?? Math.floor(cfg.d_model / cfg.heads);
  for (const key of ["d_k", "d_v"]) {
    if (!Number.isSafeInteger(cfg[key]) || cfg[key] < 1 || cfg[key] > CONFIG_LIMITS.d_ff) {
      throw new Error(`model: config ${key} must be a whole number in 1..${CONFIG_LIMITS.d_ff}`);
    }
  }
  cfg.useFinalNorm = cfg.final_norm === null || cfg.final_norm === undefined ? cfg.norm_placement === "pre" : !!cfg.final_norm;
  return cfg;
}

export class Transformer {
  constructor(config, tensors) {
    const cfg = (this.config = completeConfig(config));
    const d = cfg.d_model;
    this.srcToken = tensorOf(tensors, "src_embed.token.weight", [cfg.src_vocab, d]);
    this.tgtToken = cfg.share_embeddings ? this.srcToken : tensorOf(tensors, "tgt_embed.token.weight", [cfg.tgt_vocab, d]);
    if (cfg.positions === "learned") {
      this.srcLearned = tensorOf(tensors, "src_embed.learned.table.weight", [cfg.max_len, d]);
      this.tgtLearned = tensorOf(tensors, "tgt_embed.learned.table.weight", [cfg.max_len, d]);
    }
    this.sinusoidal = cfg.positions === "sinusoidal" ? sinusoidalPositions(cfg.max_len, d, cfg.position_layout) : null;
    this.encoderLayers = Array.from({ length: cfg.encoder_layers }, (_, i) => layerOf(tensors, `encoder.layers.${i}`, cfg, false));
    this.decoderLayers = Array.from({ length: cfg.decoder_layers }, (_, i) => layerOf(tensors, `decoder.layers.${i}`, cfg, true));
    this.encoderNorm = cfg.useFinalNorm ? normOf(tensors, "encoder.norm", d) : null;
    this.decoderNorm = cfg.useFinalNorm ? normOf(tensors, "decoder.norm", d) : null;
    this.head = {
      weight: cfg.tie_target ? this.tgtToken : tensorOf(tensors, "head.weight", [cfg.tgt_vocab, d]),
      bias: cfg.head_bias ? tensorOf(tensors, "head.bias", [cfg.tgt_vocab]) : null,
    };
    this.names = new Set(this.probeNames());
    this.tensors = tensors;                           // name -> {shape, data}: the weights (live: training updates them)
  }

  // every probe this model has: stack by stack, layer by layer (docs/probes.md)
  probeNames() {
    const cfg = this.config, names = ["encoder.embedding"];
    const attention = (prefix) => {
      const out = [];
      for (let h = 0; h < cfg.heads; h++) {
        for (const part of ["q", "k", "v", "scores", "scaled_scores", "weights", "output"]) out.push(`${prefix}.head.${h}.${part}`);
      }
      return [...out, `${prefix}.mask`, `${prefix}.concat`, `${prefix}.output`];
    };
    const sublayer = (prefix) => ["input", "residual", "normed"].map((part) => `${prefix}.${part}`);
    for (let i = 0; i < cfg.encoder_layers; i++) {
      const p = `encoder.${i}`;
      names.push(...attention(`${p}.self_attention`), `${p}.ffn.hidden`, `${p}.ffn.output`,
        ...sublayer(`${p}.sublayer.0`), ...sublayer(`${p}.sublayer.1`), `${p}.output`);
    }
    names.push("encoder.output", "decoder.embedding");
    for (let i = 0; i < cfg.decoder_layers; i++) {
      const p = `decoder.${i}`;
      names.push(...attention(`${p}.self_attention`), ...attention(`${p}.cross_attention`), `${p}.ffn.hidden`,
        `${p}.ffn.output`, ...sublayer(`${p}.sublayer.0`), ...sublayer(`${p}.sublayer.1`), ...sublayer(`${p}.sublayer.2`),
        `${p}.output`);
    }
    names.push("decoder.output", "logits");
    return names;
  }

  context(opts = {}) {
    return opts instanceof ProbeContext ? opts : new ProbeContext(this.names, opts);
  }

  // token embedding x sqrt(d) + position vector; ids (n,) at absolute positions offset.. -> (n, d)
  // backward: table[id_i] += sqrt(d) dx_i (a token met twice gets both rows), learned[offset + i] += dx_i; the
  // sinusoidal table is fixed. The tape's weights only: the ids are not differentiable.
  embed(ids, table, learned, offset, tape) {
    const cfg = this.config, d = cfg.d_model, vocab = table.shape[0];
    if (offset + ids.length > cfg.max_len && (cfg.positions === "sinusoidal" || cfg.positions === "learned")) {
      throw new Error(`sequence length ${offset + ids.length} exceeds max_len ${cfg.max_len}`);
    }
    const scale = cfg.scale_embeddings ? Math.sqrt(d) : 1;
    const x = valueMatrix(ids.length, d, tape);
    ids.forEach((id, i) => {
      if (!Number.isInteger(id) || id < 0 || id >= vocab) throw new Error(`token id out of range [0, ${vocab}): ${id}`);
      for (let c = 0; c < d; c++) {
        let value = table.data[id * d + c] * scale;
        if (this.sinusoidal) value = this.sinusoidal.data[(offset + i) * d + c] + value;
        else if (learned) value += learned.data[(offset + i) * d + c];
        x.data[i * d + c] = value;
      }
    });
    if (tape && tape.weights) {
      tape.push(() => {
        const dx = tape.gradIf(x);
        if (!dx) return;
        const dTable = tape.weightGrad(table), dLearned = learned ? tape.weightGrad(learned) : null;
        ids.forEach((id, i) => {
          for (let c = 0; c < d; c++) dTable[id * d + c] += scale * dx[i * d + c];
          if (dLearned) for (let c = 0; c < d; c++) dLearned[(offset + i) * d + c] += dx[i * d + c];
        });
      });
    }
    return x;
  }

  // src ids (S,) -> {memory: H (S, d), padding: PAD flags or null, probes}
  encode(srcIds, opts = {}) {
    const ctx = this.context(opts);
    const padding = srcIds.map((id) => id === this.config.pad_id);
    const visible = paddingMask(srcIds.length, padding);                 // (src, src)
    let x = ctx.at("encoder.embedding", this.embed(srcIds, this.srcToken, this.srcLearned, 0, ctx.tape));
    this.encoderLayers.forEach((p, i) => { x = encoderLayer(this, p, x, visible, ctx, `encoder.${i}`); });
    if (this.encoderNorm) x = layerNormRows(x, this.encoderNorm, this.config.eps, ctx.tape);
    const memory = ctx.at("encoder.output", x);
    return { memory, padding: padding.some(Boolean) ? padding : null, flags: padding, probes: ctx.probes };
  }

  // decoder rows -> vocabulary scores (rows, V). Tied: head.weight IS the target embedding's tensor, so on a
  // tape its gradient and the embedding's add into one buffer (Tape.weightGrad).
  logitsOf(hidden, tape) {
    return linear(hidden, this.head.weight, this.head.bias, tape);
  }

  // the decoder over target ids at positions offset..; `cache` for incremental decoding
  decodeRows(tgtIds, encoded, cache, ctx) {
    const offset = cache ? cache.length : 0;
    let y = ctx.at("decoder.embedding", this.embed(tgtIds, this.tgtToken, this.tgtLearned, offset, ctx.tape));
    const cross = cache && cache.cross ? cache.cross
      : this.decoderLayers.map((p) => projectMemory(this, p.cross_attention, encoded.memory, ctx.tape));
    if (cache) cache.cross = cross;
    this.decoderLayers.forEach((p, i) => {
      y = decoderLayer(this, p, y, encoded, cross[i], cache ? cache.layer(i) : null, offset, ctx, `decoder.${i}`);
    });
    if (cache) cache.length += tgtIds.length;
    if (this.decoderNorm) y = layerNormRows(y, this.decoderNorm, this.config.eps, ctx.tape);
    y = ctx.at("decoder.output", y);
    return ctx.at("logits", this.logitsOf(y, ctx.tape));
  }

  // Teacher forcing: every target row's next-token logits in one pass
  forward(srcIds, tgtInIds, opts = {}) {
    const ctx = this.context(opts);
    const encoded = this.encode(srcIds, ctx);
    // forward passes the source padding to cross-attention always (its mask probe fires), as the PyTorch model
    const logits = this.decodeRows(tgtInIds, { memory: encoded.memory, padding: encoded.flags }, null, ctx);
    return { logits: rowsOf(logits), probes: ctx.probes };
  }

  // the decoder only, for an encoded source (patching reruns it over one encoding)
  decode(tgtInIds, encoded, opts = {}) {
    const ctx = this.context(opts);
    const logits = this.decodeRows(tgtInIds, { memory: encoded.memory, padding: encoded.flags }, null, ctx);
    return { logits: rowsOf(logits), probes: ctx.probes };
  }

  newCache() {
    return new KVCache(this.config);
  }

  // one incremental step: the newest target token at position cache.length -> its logits (V,)
  decodeStep(tokenId, encoded, cache, opts = {}) {
    const ctx = this.context(opts);
    const logits = this.decodeRows([tokenId], encoded, cache, ctx);
    return { logits: logits.data, probes: ctx.probes };
  }
}

export function rowsOf(m) {
  return Array.from({ length: m.rows }, (_, i) => m.data.subarray(i * m.cols, (i + 1) * m.cols));
}


// ---- reverse mode over a whole pass --------------------------------------------------------------------

// One teacher-forced pass kept on a tape: logits (T, V) as a Matrix, and backward(dLogits) for any number of
// objectives over the same forward (each backward starts from zero gradients).
export class Pass {
  constructor(model, tape, ctx, logits) {
    this.model = model;
    this.tape = tape;
    this.ctx = ctx;
    this.logits = logits;                             // Matrix (T, V)
    this.srcEmbedding = ctx.kept.get("encoder.embedding");   // the values at the hook points (T, d), (S, d)
    this.tgtEmbedding = ctx.kept.get("decoder.embedding");
  }

  // dL/d(every value of the pass), from dL/dlogits (a Matrix (T, V) or its Float64Array); a second backward
  // starts again from zero gradients (the weights' too)
  backward(dLogits) {
    if (this.ran) this.tape.zero();
    this.ran = true;
    this.tape.backward(this.logits, dLogits);
    return this;
  }

  // dL/d(value) at a kept probe (`keep` of the pass; the embeddings always) as a Matrix; zeros when the
  // objective does not depend on it
  gradAt(name) {
    const value = this.ctx.kept.get(name);
    if (!value) throw new Error(`gradient: probe ${name} was not kept by this pass`);
    const g = this.tape.gradIf(value);
    return matrix(value.rows, value.cols, g ? Float64Array.from(g) : new Float64Array(value.data.length));
  }

  // dL/dW of every weight, by its state_dict name (a tensor stored once for two uses holds both gradients)
  weightGradients() {
    const out = new Map();
    for (const [name, t] of this.model.tensors) {
      const g = this.tape.weightGrads.get(t);
      out.set(name, g ? Float64Array.from(g) : new Float64Array(t.data.length));
    }
    return out;
  }
}

// Teacher forcing on a tape. opts as forward's (off, intervene, record) plus: weights (default true; false:
// the inputs' gradients only, as attribution needs), embeddings {src, tgt}: Matrices (S, d), (T, d) that
// replace the values at encoder.embedding / decoder.embedding, keep: probe names whose gradients are read,
// weightGrads: a Map (weight tensor -> Float64Array) the weights' gradients are added into (a batch's sum).
export function tapedPass(model, srcIds, tgtInIds, opts = {}) {
  const tape = new Tape({ weights: opts.weights ?? true, weightGrads: opts.weightGrads });
  const intervene = { ...(opts.intervene || {}) };
  const given = opts.embeddings || {};
  if (given.src) intervene["encoder.embedding"] = () => given.src;
  if (given.tgt) intervene["decoder.embedding"] = () => given.tgt;
  const keep = ["encoder.embedding", "decoder.embedding", ...(opts.keep || [])];
  const ctx = model.context({ record: opts.record, off: opts.off, intervene, keep, tape });
  const encoded = model.encode(srcIds, ctx);
  const logits = model.decodeRows(tgtInIds, { memory: encoded.memory, padding: encoded.flags }, null, ctx);
  return new Pass(model, tape, ctx, logits);
}

// log-softmax of row i of a Matrix, float64
export function logSoftmaxRow(m, i) {
  const V = m.cols, row = m.data.subarray(i * V, (i + 1) * V), out = new Float64Array(V);
  let top = -Infinity;
  for (let c = 0; c < V; c++) if (row[c] > top) top = row[c];
  let total = 0;
  for (let c = 0; c < V; c++) total += Math.exp(row[c] - top);
  const lse = top + Math.log(total);
  for (let c = 0; c < V; c++) out[c] = row[c] - lse;
  return out;
}

// The training loss of transformer.py's loss_sum: label-smoothed cross-entropy summed over the rows whose
// label is not PAD (a PAD row adds nothing and gets no gradient), as F.cross_entropy(label_smoothing=eps):
//     q = (1 - eps) onehot(y) + eps / V,      loss_row = -sum_c q_c log p_c
//     backward:  dlogits_row = (p - q) * scale          (scale: 1 / the batch's non-PAD labels in training)
export function labelSmoothedLoss(logits, labels, smoothing = 0, padId = 0, scale = 1) {
  const T = logits.rows, V = logits.cols, grad = matrix(T, V);
  if (labels.length !== T) throw new Error(`loss: ${labels.length} labels for ${T} target rows`);
  let value = 0, count = 0;
  for (let i = 0; i < T; i++) {
    const y = labels[i];
    if (y === padId) continue;                                           // PAD: not a token to predict
    if (!Number.isInteger(y) || y < 0 || y >= V) throw new Error(`loss: label ${y} out of range [0, ${V})`);
    count++;
    const logp = logSoftmaxRow(logits, i);
    let sumLogp = 0;
    for (let c = 0; c < V; c++) sumLogp += logp[c];
    value += (1 - smoothing) * -logp[y] + smoothing * (-sumLogp / V);
    for (let c = 0; c < V; c++) {
      const q = smoothing / V + (c === y ? 1 - smoothing : 0);
      grad.data[i * V + c] = (Math.exp(logp[c]) - q) * scale;
    }
  }
  return { value: value * scale, count, grad };
}

// Attribution's objective at target row `row` (interpret/integrated.py `objective`):
//     f = log p(token) - log p(contrast) (the contrast term only when contrast >= 0)
//     backward:  df/dlogits = onehot(token) - p - (onehot(contrast) - p)
export function logProbObjective(logits, row, token, contrast = null) {
  const V = logits.cols, grad = matrix(logits.rows, V), logp = logSoftmaxRow(logits, row);
  const against = contrast !== null && contrast !== undefined && contrast >= 0;
  for (let c = 0; c < V; c++) {
    const p = Math.exp(logp[c]);
    let g = (c === token ? 1 : 0) - p;
    if (against) g -= (c === contrast ? 1 : 0) - p;
    grad.data[row * V + c] = g;
  }
  return { value: against ? logp[token] - logp[contrast] : logp[token], grad };
}

// Gradients of one sentence's pass: {params: Map name -> Float64Array (the tensor's layout), srcEmbedding:
// Matrix (S, d), tgtEmbedding: Matrix (T, d) (dL/d the values at encoder.embedding / decoder.embedding), value}.
// seed, what is differentiated:
//   {labels, smoothing = 0, scale = 1}    the label-smoothed loss (labels (T,), PAD rows left out), or
//   {row, token, contrast = null}         f = log p(token) (- log p(contrast)) at target row `row`, or
//   (logits: Matrix) => {value, grad: Matrix}
// opts: as tapedPass's (off, embeddings, weights).
export function gradients(model, srcIds, tgtInIds, seed, opts = {}) {
  const pass = tapedPass(model, srcIds, tgtInIds, opts);
  let objective;
  if (typeof seed === "function") objective = seed(pass.logits);
  else if (seed && Array.isArray(seed.labels)) {
    objective = labelSmoothedLoss(pass.logits, seed.labels, seed.smoothing ?? 0, model.config.pad_id, seed.scale ?? 1);
  } else if (seed && Number.isInteger(seed.row)) {
    objective = logProbObjective(pass.logits, seed.row, seed.token, seed.contrast ?? null);
  } else {
    throw new Error("gradients: seed must be {labels, smoothing}, {row, token, contrast} or a function of the logits");
  }
  pass.backward(objective.grad);
  return {
    params: opts.weights === false ? new Map() : pass.weightGradients(),
    srcEmbedding: pass.gradAt("encoder.embedding"),
    tgtEmbedding: pass.gradAt("decoder.embedding"),
    value: objective.value,
  };
}
