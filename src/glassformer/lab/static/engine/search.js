// Search: greedy and beam search with the rules of `glassformer translate` (decoding/search.py), one sentence:
//
// - output limit: 2 * source length + 10 generated tokens (EOS included), capped by the model's max_len
//   (or a given limit, also capped);
// - a hypothesis' score is the sum of its token log-probabilities (float64); finished hypotheses rank by
//   score / length^alpha, the length counting EOS;
// - each step the 2K best continuations of all K beams are ranked (PAD never); among them EOS in the top K
//   finishes a hypothesis (at the limit any token in the top K does); the best K that do not finish stay live;
// - the sentence is done when no live beam can still beat the best finished hypothesis: a live beam with
//   score s at length L reaches at best max(s / (L+1)^alpha, s / limit^alpha) (stop rule "bound").
// Each beam keeps its own KV cache (a copy of its parent's when two beams continue one).

export const LENGTH_A = 2.0;
export const LENGTH_B = 10;
export const DEFAULT_ALPHA = 1.0;

// most tokens one sentence may generate, EOS included
export function outputLimit(sourceLength, modelMaxLen, maxLen) {
  const limit = maxLen === undefined || maxLen === null
    ? Math.min(Math.floor(sourceLength * LENGTH_A) + LENGTH_B, modelMaxLen)
    : Math.min(maxLen, modelMaxLen);
  if (!Number.isInteger(limit) || limit < 1) throw new Error(`max_len: expected a limit >= 1, got ${limit}`);
  return limit;
}

// log-softmax of one row of logits in float64, PAD at -inf (it is never chosen)
export function logSoftmaxWithoutPad(logits, padId) {
  let top = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i] > top) top = logits[i];
  let total = 0;
  for (let i = 0; i < logits.length; i++) total += Math.exp(logits[i] - top);
  const lse = top + Math.log(total);
  const out = new Float64Array(logits.length);
  for (let i = 0; i < logits.length; i++) out[i] = logits[i] - lse;
  out[padId] = -Infinity;
  return out;
}

function lengthNormalized(score, length, alpha) {
  return score / length ** alpha;
}

// the n best (value, beam, token) over every live beam's row, best first (the order of equal values: lower index)
function bestContinuations(beams, logProbs, n) {
  const best = [];                                                       // kept sorted, at most n
  beams.forEach((beam, b) => {
    const row = logProbs[b];
    for (let token = 0; token < row.length; token++) {
      const value = beam.score + row[token];
      if (best.length === n && !(value > best[n - 1].value)) continue;
      let at = best.length;
      while (at > 0 && value > best[at - 1].value) at--;
      best.splice(at, 0, { value, parent: b, token });
      if (best.length > n) best.pop();
    }
  });
  return best;
}

// The best hypothesis of `beam` beams: {tokens (without BOS/EOS), score, normalized, finished}
export function generate(model, srcIds, { beam = 1, lengthPenalty = DEFAULT_ALPHA, maxLen, off = [] } = {}) {
  const cfg = model.config, alpha = lengthPenalty;
  if (!Number.isInteger(beam) || beam < 1) throw new Error(`beam must be >= 1, got ${beam}`);
  const sourceLength = srcIds.filter((id) => id !== cfg.pad_id).length;
  const limit = outputLimit(sourceLength, cfg.max_len, maxLen);
  const opts = off.length ? { off } : {};
  const encoded = model.encode(srcIds, opts);
  let beams = [{ score: 0, tokens: [], last: cfg.bos_id, cache: model.newCache() }];
  let finished = null;                                                   // the best finished hypothesis
  for (let length = 1; ; length++) {                                     // tokens generated after this step
    const logProbs = beams.map((b) => logSoftmaxWithoutPad(model.decodeStep(b.last, encoded, b.cache, opts).logits, cfg.pad_id));
    const atLimit = length >= limit;
    const ranked = bestContinuations(beams, logProbs, beam === 1 ? 1 : 2 * beam).filter((c) => c.value > -Infinity);
    const kept = [];
    ranked.forEach((c, rank) => {
      const ends = c.token === cfg.eos_id || atLimit;
      if (ends && rank < beam) {                                         // only the top K may finish
        const tokens = c.token === cfg.eos_id ? beams[c.parent].tokens : [...beams[c.parent].tokens, c.token];
        const hyp = { tokens, score: c.value, normalized: lengthNormalized(c.value, length, alpha), finished: c.token === cfg.eos_id };
        if (finished === null || hyp.normalized > finished.normalized) finished = hyp;   // the earlier wins ties
      } else if (!ends && kept.length < beam) {
        kept.push(c);
      }
    });
    const worst = finished === null ? -Infinity : finished.normalized;
    let bound = -Infinity;                                               // the best a live beam can still reach
    for (const c of kept) {
      const nearest = Math.min(length + 1, limit);
      bound = Math.max(bound, c.value / nearest ** alpha, c.value / limit ** alpha);
    }
    if (atLimit || kept.length === 0 || (beam > 1 && bound <= worst)) break;
    const children = new Map();                                          // beams follow their parents' caches
    beams = kept.map((c) => {
      const parent = beams[c.parent];
      const uses = children.get(c.parent) || 0;
      children.set(c.parent, uses + 1);
      return { score: c.value, tokens: [...parent.tokens, c.token], last: c.token, cache: uses ? parent.cache.clone() : parent.cache };
    });
  }
  return finished || { tokens: [], score: -Infinity, normalized: -Infinity, finished: false };
}

// Most probable next token at every step; target ids without BOS/EOS
export function greedy(model, srcIds, { maxLen, off } = {}) {
  return generate(model, srcIds, { beam: 1, maxLen, off }).tokens;
}

// The best hypothesis of K beams (length penalty alpha); target ids without BOS/EOS
export function beamSearch(model, srcIds, { beam = 4, lengthPenalty = DEFAULT_ALPHA, maxLen, off } = {}) {
  return generate(model, srcIds, { beam, lengthPenalty, maxLen, off }).tokens;
}
