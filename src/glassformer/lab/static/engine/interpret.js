// Reading the model: the next-token distribution, activation patching (interpret/patching.py), the logit lens
// (interpret/lens.py) and ALTI+ (interpret/alti.py), over the engine's probes, in float64.

import { matrix, layerNormRows, linear } from "./model.js";

// softmax of one row of logits, float64
export function softmaxRow(logits) {
  let top = -Infinity;
  for (const v of logits) if (v > top) top = v;
  const p = new Float64Array(logits.length);
  let total = 0;
  for (let i = 0; i < logits.length; i++) total += (p[i] = Math.exp(logits[i] - top));
  for (let i = 0; i < p.length; i++) p[i] /= total;
  return p;
}

// p(next | BOS + prefix): [{id, p}], most probable first (`top` entries; Infinity for all)
export function nextDistribution(model, srcIds, prefixIds, { off = [], top = 20 } = {}) {
  const tgtIn = [model.config.bos_id, ...prefixIds];
  const { logits } = model.forward(srcIds, tgtIn, { off });
  const p = softmaxRow(logits[tgtIn.length - 1]);
  const order = Array.from(p, (value, id) => ({ id, p: value }));
  order.sort((a, b) => b.p - a.p || a.id - b.id);
  return order.slice(0, Math.min(top, order.length));
}

// ---- activation patching -------------------------------------------------------------------------------

export const FLAT = 1e-9;          // |p_clean - p_corrupt| below this: the corruption changed nothing to restore

// the cross-attention heads' output probes [layer][head], and the encoder's residual stream layer by layer
export function patchSites(model) {
  const cfg = model.config;
  const heads = Array.from({ length: cfg.decoder_layers }, (_, i) =>
    Array.from({ length: cfg.heads }, (_, h) => `decoder.${i}.cross_attention.head.${h}.output`));
  const layers = ["encoder.embedding", ...Array.from({ length: cfg.encoder_layers }, (_, i) => `encoder.${i}.output`)];
  return { heads, layers };
}

function copyPositionFrom(clean, position) {
  return (value, name) => {
    const out = matrix(value.rows, value.cols, Float64Array.from(value.data));
    const source = clean.get(name);
    out.data.set(source.data.subarray(position * value.cols, (position + 1) * value.cols), position * value.cols);
    return out;
  };
}

// A patching scan's arguments (activation and attribution patching alike): one line naming what is wrong
export function checkPatchArguments(cleanIds, corruptIds, tgtInIds, row, positions) {
  if (positions && cleanIds.length !== corruptIds.length) {
    throw new Error(`positions: the clean sentence has ${cleanIds.length} units and the corrupted one ` +
                    `${corruptIds.length}; patching positions needs the same count`);
  }
  if (!(Number.isInteger(row) && row >= 0 && row < tgtInIds.length)) {
    throw new Error(`row ${row} is outside the target input of ${tgtInIds.length} positions`);
  }
}

// Patch each cross-attention head and (with positions) each encoder position from the clean run into the
// corrupted one; p(token) at target row `row`. A generator: yields {done, total} after each run and returns
// the table of patch_scan. Row `row` sees target inputs 0..row only, so the runs stop there (the same numbers).
export function* patchingScan(model, cleanIds, corruptIds, tgtInIds, row, token, { positions = true } = {}) {
  checkPatchArguments(cleanIds, corruptIds, tgtInIds, row, positions);
  const { heads, layers } = patchSites(model);
  const everyHead = heads.flat();
  const tgtIn = tgtInIds.slice(0, row + 1);
  const total = 3 + everyHead.length + (positions ? layers.length * (cleanIds.length + 1) : 0);
  let done = 0;
  const pOf = (logits) => softmaxRow(logits[row])[token];

  const clean = model.forward(cleanIds, tgtIn, { record: [...everyHead, ...layers] });
  const pClean = pOf(clean.logits);
  const corrupt = model.encode(corruptIds);
  const pCorrupt = pOf(model.decode(tgtIn, corrupt).logits);
  const gap = pClean - pCorrupt;
  done += 2;
  yield { done, total };
  const patched = (p) => ({ p, fraction: Math.abs(gap) >= FLAT ? (p - pCorrupt) / gap : null });
  const copy = (value, name) => clean.probes.get(name);
  const decoderPatch = (names) => patched(pOf(model.decode(tgtIn, corrupt, {
    intervene: Object.fromEntries(names.map((name) => [name, copy])) }).logits));
  const encoderPatch = (intervene) => patched(pOf(model.forward(corruptIds, tgtIn, { intervene }).logits));

  const result = { p_clean: pClean, p_corrupt: pCorrupt, heads: [] };
  for (const layer of heads) {
    const cells = [];
    for (const name of layer) {
      cells.push(decoderPatch([name]));
      yield { done: ++done, total };
    }
    result.heads.push(cells);
  }
  result.all_heads = decoderPatch(everyHead);
  result.nothing = patched(pCorrupt);
  result.position_layers = positions ? layers : [];
  result.positions = null;
  yield { done: ++done, total };
  if (positions) {
    result.positions = [];
    for (const name of layers) {
      const cells = [];
      for (let j = 0; j < cleanIds.length; j++) {
        cells.push(encoderPatch({ [name]: copyPositionFrom(clean.probes, j) }));
        yield { done: ++done, total };
      }
      result.positions.push(cells);
    }
    result.all_positions = [];
    for (const name of layers) {
      result.all_positions.push(encoderPatch({ [name]: copy }));
      yield { done: ++done, total };
    }
  }
  return result;
}

// The whole scan at once (patchingScan run to its end); onProgress({done, total}) after each run
export function patchingTable(model, cleanIds, corruptIds, tgtInIds, row, token, { positions = true, onProgress } = {}) {
  const scan = patchingScan(model, cleanIds, corruptIds, tgtInIds, row, token, { positions });
  for (;;) {
    const step = scan.next();
    if (step.done) return step.value;
    if (onProgress) onProgress(step.value);
  }
}

// ---- the logit lens ------------------------------------------------------------------------------------

const LENS_SUBLAYERS = ["self-attention", "cross-attention", "ffn"];

export function lensReading(model) {
  const final = model.decoderNorm !== null;
  if (model.config.norm_placement === "post") {
    return "post-norm: each sub-layer's LayerNorm output, read directly" + (final ? " (then the decoder's final LayerNorm)" : "");
  }
  return "pre-norm: the residual stream after each sub-layer, through the decoder's final LayerNorm";
}

// p(token) (and p(contrast)) at target row `row` after every decoder sub-layer, and the model's own p
export function logitLens(model, srcIds, tgtInIds, row, token, contrast = null) {
  if (!(Number.isInteger(row) && row >= 0 && row < tgtInIds.length)) {
    throw new Error(`row: ${row} is outside the target rows 0..${tgtInIds.length - 1}`);
  }
  const cfg = model.config, part = cfg.norm_placement === "post" ? "normed" : "residual";
  const sites = [];
  for (let i = 0; i < cfg.decoder_layers; i++) {
    for (let j = 0; j < 3; j++) sites.push([i, j, `decoder.${i}.sublayer.${j}.${part}`]);
  }
  const { logits, probes } = model.forward(srcIds, tgtInIds, { record: sites.map(([, , name]) => name) });
  const steps = sites.map(([i, j, name]) => {
    const value = probes.get(name);
    let h = matrix(1, value.cols, value.data.slice(row * value.cols, (row + 1) * value.cols));   // (1, d)
    if (model.decoderNorm) h = layerNormRows(h, model.decoderNorm, cfg.eps);
    const p = softmaxRow(model.logitsOf(h).data);
    return { layer: i, sublayer: j, name: LENS_SUBLAYERS[j], p: p[token], p_contrast: contrast === null ? null : p[contrast] };
  });
  const pModel = softmaxRow(logits[row]);
  return { reading: lensReading(model), row, steps, p_model: pModel[token],
    p_contrast_model: contrast === null ? null : pModel[contrast] };
}

// ---- ALTI+ ---------------------------------------------------------------------------------------------

// v_j W_V^h W_O^h for every head and value row: [h] -> (m, d)
function projectedValues(model, p, values) {
  const cfg = model.config, H = cfg.heads, dv = cfg.d_v, d = cfg.d_model;
  const wo = p.w_o.weight.data;                                          // (d, H d_v)
  const perHead = linear(values, p.w_v.weight, null);                     // (m, H d_v) rows v_j W_V
  return Array.from({ length: H }, (_, h) => {
    const out = matrix(values.rows, d);
    for (let j = 0; j < values.rows; j++) {
      for (let f = 0; f < d; f++) {
        let sum = 0;
        for (let e = 0; e < dv; e++) sum += perHead.data[j * H * dv + h * dv + e] * wo[f * H * dv + h * dv + e];
        out.data[j * d + f] = sum;
      }
    }
    return out;
  });
}

function mean(values) {
  let s = 0;
  for (const v of values) s += v;
  return s / values.length;
}

// One attention block's contributions c^_ij (n, m), or (n, 1 + S) for cross-attention (column 0 the residual).
// The biases (and a pre-norm beta) are no token's: they shift y_i but are not a term T_i(x_j).
export function blockContributions(model, p, norm, post, weights, values, residual, summed, output, cross) {
  const d = model.config.d_model, H = weights.length, n = residual.rows, m = values.rows;
  const projected = projectedValues(model, p, values);
  const width = m + (cross ? 1 : 0);
  const out = matrix(n, width);
  for (let i = 0; i < n; i++) {
    let sigma = 0;
    if (post) {
      const s = summed.data.subarray(i * d, (i + 1) * d), mu = mean(s);
      let variance = 0;
      for (const v of s) variance += (v - mu) * (v - mu);
      sigma = Math.sqrt(variance / d + model.config.eps);
    }
    const y = output.data.subarray(i * d, (i + 1) * d);
    let yNorm = 0;
    for (const v of y) yNorm += Math.abs(v);
    for (let c = 0; c < width; c++) {
      const z = new Float64Array(d);                                     // z_i(x_j)
      const j = cross ? c - 1 : c;
      if (!cross || c > 0) {
        for (let h = 0; h < H; h++) {
          const a = weights[h].data[i * m + j];
          if (a === 0) continue;
          for (let f = 0; f < d; f++) z[f] += a * projected[h].data[j * d + f];
        }
      }
      if ((cross && c === 0) || (!cross && j === i)) {
        for (let f = 0; f < d; f++) z[f] += residual.data[i * d + f];    // the row's own residual x_i
      }
      let term = z;
      if (post) {                                                        // gamma (z - mean z) / sigma_i
        const mu = mean(z);
        term = new Float64Array(d);
        for (let f = 0; f < d; f++) term[f] = (norm.weight.data[f] * (z[f] - mu)) / sigma;
      }
      let distance = 0;
      for (let f = 0; f < d; f++) distance += Math.abs(y[f] - term[f]);
      out.data[i * width + c] = Math.max(0, yNorm - distance);           // max(0, |y_i|_1 - |y_i - T_i(x_j)|_1)
    }
    let total = 0;
    for (let c = 0; c < width; c++) total += out.data[i * width + c];
    for (let c = 0; c < width; c++) {
      if (total > 0) out.data[i * width + c] /= total;
      else out.data[i * width + c] = c === (cross ? 0 : i) ? 1 : 0;       // the row keeps itself
    }
  }
  return out;
}

function matmulMatrices(a, b) {
  const out = matrix(a.rows, b.cols);
  for (let i = 0; i < a.rows; i++) {
    for (let k = 0; k < a.cols; k++) {
      const v = a.data[i * a.cols + k];
      if (v === 0) continue;
      for (let j = 0; j < b.cols; j++) out.data[i * b.cols + j] += v * b.data[k * b.cols + j];
    }
  }
  return out;
}

function identity(n) {
  const out = matrix(n, n);
  for (let i = 0; i < n; i++) out.data[i * n + i] = 1;
  return out;
}

// The attention blocks of one layer, as interpret/alti.py _layer_blocks: [{cross, c}] in running order
function layerContributions(model, stack, i, layer, post, probes, memory) {
  const get = (name) => probes.get(name);
  const headWeights = (attn) => Array.from({ length: model.config.heads }, (_, h) => get(`${stack}.${i}.${attn}.head.${h}.weights`));
  const blocks = [];
  let sub = `${stack}.${i}.sublayer.0`;
  const x = get(`${sub}.input`);
  let values = x, summed, output;
  if (post) {
    summed = get(`${sub}.residual`);
    output = get(`${sub}.normed`);
  } else {
    const beta = layer.norms[0].bias.data, normed = get(`${sub}.normed`);
    values = matrix(normed.rows, normed.cols, normed.data.map((v, k) => v - beta[k % normed.cols]));   // gamma x^_j
    summed = output = get(`${sub}.residual`);
  }
  blocks.push({ cross: false, c: blockContributions(model, layer.self_attention, layer.norms[0], post,
    headWeights("self_attention"), values, x, summed, output, false) });
  if (memory) {
    sub = `${stack}.${i}.sublayer.1`;
    const xc = get(`${sub}.input`), summedC = get(`${sub}.residual`);
    blocks.push({ cross: true, c: blockContributions(model, layer.cross_attention, layer.norms[1], post,
      headWeights("cross_attention"), memory, xc, summedC, post ? get(`${sub}.normed`) : summedC, true) });
  }
  return blocks;
}

// ALTI+ of the whole model: M (T, S + T), row t's contributions from the source units and the target inputs
export function altiPlus(model, srcIds, tgtInIds) {
  const cfg = model.config, post = cfg.norm_placement === "post";
  const { probes } = model.forward(srcIds, tgtInIds, { record: [
    "*.head.*.weights", "encoder.*.sublayer.0.*", "decoder.*.sublayer.0.*", "decoder.*.sublayer.1.*", "encoder.output"] });
  const S = srcIds.length, T = tgtInIds.length;
  const memory = probes.get("encoder.output");
  let encoder = identity(S);                                              // C_enc (S, S)
  model.encoderLayers.forEach((layer, i) => {
    for (const block of layerContributions(model, "encoder", i, layer, post, probes, null)) encoder = matmulMatrices(block.c, encoder);
  });
  let m = matrix(T, S + T);                                               // [0 | I]
  for (let t = 0; t < T; t++) m.data[t * (S + T) + S + t] = 1;
  model.decoderLayers.forEach((layer, i) => {
    for (const block of layerContributions(model, "decoder", i, layer, post, probes, memory)) {
      if (!block.cross) {
        m = matmulMatrices(block.c, m);                                   // M <- C_self M
        continue;
      }
      const c = block.c, next = matrix(T, S + T);                         // M_i <- r_i M_i + sum_j c_ij [C_enc[j] | 0]
      for (let t = 0; t < T; t++) {
        const r = c.data[t * (S + 1)];
        for (let k = 0; k < S + T; k++) next.data[t * (S + T) + k] = r * m.data[t * (S + T) + k];
        for (let j = 0; j < S; j++) {
          const share = c.data[t * (S + 1) + 1 + j];
          for (let k = 0; k < S; k++) next.data[t * (S + T) + k] += share * encoder.data[j * S + k];
        }
      }
      m = next;
    }
  });
  return m;
}
