// A small encoder-decoder trained from random weights, in the page (a Web Worker) or in Node: pure
// computation, no timer, no DOM. The model is the engine's Transformer over live weights; its gradients come
// from the engine's one backward pass (model.js); the optimiser is torch.optim.Adam's arithmetic and the loss
// transformer.py's (label-smoothed cross-entropy over the non-PAD target tokens, divided by their count in the
// batch, as training/loop.py divides a padded batch's summed loss).
//
// Tasks (a toy vocabulary each; the held-out and validation sequences are drawn first and never trained on):
//   copy      a b c -> a b c                (cross-attention: the diagonal)
//   reverse   a b c -> c b a                (the anti-diagonal)
//   sort      c a b -> a b c                (each output row finds its symbol)
//   grammar   a lesson-sized language: a time word moves to the end and a pronoun's form follows its role,
//             他 昨天 看见 了 她 -> he saw her yesterday,  她 明天 会 帮助 他 -> she will help him tomorrow
//             (lines that cross)

import { Transformer, tapedPass, labelSmoothedLoss, matrix } from "./model.js";
import { generate } from "./search.js";

export const SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"];          // ids 0..3, as the translator's vocabularies
const PAD = 0, BOS = 1, EOS = 2;
const LETTERS = "abcdefghijklmnopqrstuvwxyz";

// Every size a user (or a URL) controls, with its limit
export const TRAIN_LIMITS = {
  MAX_TOY_D_MODEL: 128, MAX_TOY_HEADS: 8, MAX_TOY_D_FF: 512, MAX_TOY_LAYERS: 4, MAX_TOY_BATCH: 64,
  MAX_TOY_LENGTH: 24, MAX_TOY_SYMBOLS: 26, MAX_TOY_HELD_OUT: 1000, MAX_TOY_STEPS: 100000, MAX_TOY_SECONDS: 600,
  MAX_TOY_WARMUP: 10000,
};

export const TRAIN_DEFAULTS = {
  task: "reverse",
  seed: 1,
  d_model: 32, heads: 4, d_ff: 128, encoder_layers: 1, decoder_layers: 1,
  norm_placement: "post",              // "post" | "pre"
  positions: "sinusoidal",             // "sinusoidal" | "learned" | "relative" | "rope" | "none"
  lr: 0.004,                           // Adam's learning rate at the end of the warm-up
  warmup: 50,                          // steps of linear warm-up from lr / warmup
  schedule: "inverse-sqrt",            // after the warm-up: "inverse-sqrt" (lr sqrt(warmup / step)) | "constant"
  label_smoothing: 0.1,
  clip: 1.0,                           // the gradient's norm is clipped to this (0: off), as training/loop.py
  batch: 32,                           // sequences per step
  min_length: 6, max_length: 10,       // source lengths (copy, reverse, sort)
  symbols: 12,                         // the alphabet (copy, reverse, sort): a, b, c, ...
  held_out: 200,                       // held-out sequences: the accuracy
  validation: 200,                     // validation sequences: the early stop (every eval_every steps)
  eval_every: 50,
  steps: 20000,                        // a run stops at whichever comes first: steps,
  seconds: 55,                         // seconds,
  stop_when_solved: true,              // or the validation set solved (exact match 100 %) at two checks in a row
};

const CHOICES = {
  task: ["copy", "reverse", "sort", "grammar"],
  norm_placement: ["post", "pre"],
  positions: ["sinusoidal", "learned", "relative", "rope", "none"],
  schedule: ["inverse-sqrt", "constant"],
};

// [field, lowest, highest, whole number?]
const RANGES = [
  ["seed", 0, 2 ** 31 - 1, true],
  ["d_model", 4, TRAIN_LIMITS.MAX_TOY_D_MODEL, true, "MAX_TOY_D_MODEL"],
  ["heads", 1, TRAIN_LIMITS.MAX_TOY_HEADS, true, "MAX_TOY_HEADS"],
  ["d_ff", 4, TRAIN_LIMITS.MAX_TOY_D_FF, true, "MAX_TOY_D_FF"],
  ["encoder_layers", 1, TRAIN_LIMITS.MAX_TOY_LAYERS, true, "MAX_TOY_LAYERS"],
  ["decoder_layers", 1, TRAIN_LIMITS.MAX_TOY_LAYERS, true, "MAX_TOY_LAYERS"],
  ["lr", 1e-6, 1, false],
  ["warmup", 1, TRAIN_LIMITS.MAX_TOY_WARMUP, true, "MAX_TOY_WARMUP"],
  ["label_smoothing", 0, 0.5, false],
  ["clip", 0, 1000, false],
  ["batch", 1, TRAIN_LIMITS.MAX_TOY_BATCH, true, "MAX_TOY_BATCH"],
  ["min_length", 1, TRAIN_LIMITS.MAX_TOY_LENGTH, true, "MAX_TOY_LENGTH"],
  ["max_length", 1, TRAIN_LIMITS.MAX_TOY_LENGTH, true, "MAX_TOY_LENGTH"],
  ["symbols", 2, TRAIN_LIMITS.MAX_TOY_SYMBOLS, true, "MAX_TOY_SYMBOLS"],
  ["held_out", 1, TRAIN_LIMITS.MAX_TOY_HELD_OUT, true, "MAX_TOY_HELD_OUT"],
  ["validation", 1, TRAIN_LIMITS.MAX_TOY_HELD_OUT, true, "MAX_TOY_HELD_OUT"],
  ["eval_every", 1, TRAIN_LIMITS.MAX_TOY_STEPS, true, "MAX_TOY_STEPS"],
  ["steps", 0, TRAIN_LIMITS.MAX_TOY_STEPS, true, "MAX_TOY_STEPS"],
  ["seconds", 0, TRAIN_LIMITS.MAX_TOY_SECONDS, false, "MAX_TOY_SECONDS"],
];

function invalid(field, message) {
  const error = new Error(`${field}: ${message}`);
  error.field = field;
  return error;
}

// The options with the defaults filled in; an unknown field, a wrong type or a size over its limit throws an
// Error naming the field (error.field) and its limit, in one line
export function checkTrainOptions(opts = {}) {
  if (opts === null || typeof opts !== "object" || Array.isArray(opts)) throw invalid("options", "expected an object");
  for (const key of Object.keys(opts)) {
    if (!(key in TRAIN_DEFAULTS)) throw invalid(key, `unknown option (known: ${Object.keys(TRAIN_DEFAULTS).join(", ")})`);
  }
  const o = { ...TRAIN_DEFAULTS, ...opts };
  for (const [field, choices] of Object.entries(CHOICES)) {
    if (!choices.includes(o[field])) throw invalid(field, `expected one of ${choices.join(", ")}, got ${JSON.stringify(o[field])}`);
  }
  for (const [field, low, high, whole, limit] of RANGES) {
    const v = o[field];
    if (typeof v !== "number" || !Number.isFinite(v) || (whole && !Number.isInteger(v))) {
      throw invalid(field, `expected ${whole ? "a whole number" : "a number"}, got ${JSON.stringify(v)}`);
    }
    if (v < low || v > high) {
      throw invalid(field, `${v} is outside ${low}..${high}${limit ? ` (the limit ${limit} = ${high})` : ""}`);
    }
  }
  if (typeof o.stop_when_solved !== "boolean") throw invalid("stop_when_solved", "expected true or false");
  if (o.d_model % o.heads !== 0) throw invalid("heads", `d_model ${o.d_model} is not a multiple of heads ${o.heads}`);
  if (o.positions === "rope" && (o.d_model / o.heads) % 2 !== 0) {
    throw invalid("heads", `rope needs an even width per head; d_model / heads = ${o.d_model / o.heads}`);
  }
  if (o.min_length > o.max_length) throw invalid("min_length", `${o.min_length} is over max_length ${o.max_length}`);
  return o;
}

// ---- a seeded generator: the same seed, the same run ---------------------------------------------------

// mulberry32: 32 bits of state, uniform numbers in [0, 1)
export function seededRandom(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  next.int = (n) => Math.floor(next() * n);                           // 0 .. n-1
  next.normal = () => {                                                // Box-Muller
    const u = 1 - next(), v = next();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  };
  next.shuffle = (array) => {
    for (let i = array.length - 1; i > 0; i--) {
      const j = next.int(i + 1);
      [array[i], array[j]] = [array[j], array[i]];
    }
    return array;
  };
  return next;
}

// one stream per purpose (the weights, the held-out sets, the batches), each from the seed
function stream(seed, purpose) {
  return seededRandom(Math.imul(seed + 1, 0x9e3779b1) ^ Math.imul(purpose + 1, 0x85ebca6b));
}

// ---- tasks ---------------------------------------------------------------------------------------------

// the grammar's words: [Chinese, subject form, object form]
const PEOPLE = [["我", "I", "me"], ["你", "you", "you"], ["他", "he", "him"], ["她", "she", "her"], ["我们", "we", "us"],
  ["他们", "they", "them"], ["小明", "Ming", "Ming"], ["老师", "the teacher", "the teacher"]];
// [Chinese, past, plain]
const VERBS = [["看见", "saw", "see"], ["喜欢", "liked", "like"], ["帮助", "helped", "help"], ["找到", "found", "find"],
  ["叫", "called", "call"], ["想念", "missed", "miss"]];

// Every sentence of the grammar, as [source words, target words]: the time word before or after the subject;
// 昨天 (past, 了 after the verb) -> "... yesterday", 明天 (会 before the verb) -> "will ... tomorrow"
function grammarSentences() {
  const out = [];
  for (const [s, subject] of PEOPLE) {
    for (const [v, past, plain] of VERBS) {
      for (const [o, , object] of PEOPLE) {
        if (o === s) continue;
        const english = (words) => words.join(" ").split(" ");
        out.push([[s, "昨天", v, "了", o], english([subject, past, object, "yesterday"])]);
        out.push([["昨天", s, v, "了", o], english([subject, past, object, "yesterday"])]);
        out.push([[s, "明天", "会", v, o], english([subject, "will", plain, object, "tomorrow"])]);
        out.push([["明天", s, "会", v, o], english([subject, "will", plain, object, "tomorrow"])]);
      }
    }
  }
  return out;
}

function grammarVocab() {
  const source = [...new Set(["昨天", "明天", "了", "会", ...PEOPLE.map((p) => p[0]), ...VERBS.map((v) => v[0])])];
  const target = [...new Set(grammarSentences().flatMap(([, t]) => t))];
  return { source: [...SPECIALS, ...source], target: [...SPECIALS, ...target] };
}

// A task: its vocabularies (index = id) and how its pairs are drawn; `draw(random)` -> [source words, target words]
function makeTask(o) {
  if (o.task === "grammar") {
    const all = grammarSentences();
    return { vocab: grammarVocab(), all, draw: (random) => all[random.int(all.length)] };
  }
  const alphabet = LETTERS.slice(0, o.symbols).split("");
  const rule = { copy: (x) => x.slice(), reverse: (x) => x.slice().reverse(),
    sort: (x) => x.slice().sort((a, b) => alphabet.indexOf(a) - alphabet.indexOf(b)) }[o.task];
  const draw = (random) => {
    const n = o.min_length + random.int(o.max_length - o.min_length + 1);
    const source = Array.from({ length: n }, () => alphabet[random.int(alphabet.length)]);
    return [source, rule(source)];
  };
  return { vocab: { source: [...SPECIALS, ...alphabet], target: [...SPECIALS, ...alphabet] }, all: null, draw };
}

export const TASKS = {
  copy: "copy the symbols",
  reverse: "reverse the symbols",
  sort: "sort the symbols (alphabet order)",
  grammar: "a time word moves to the end, a pronoun takes its role's form (他 昨天 看见 了 她 -> he saw her yesterday)",
};

// ---- weights as the PyTorch model initialises them --------------------------------------------------------

// Glorot / Xavier uniform: U(-a, a), a = gain sqrt(6 / (fan_in + fan_out)) (nn.init.xavier_uniform_)
function xavier(random, out, inp, gain = 1) {
  const a = gain * Math.sqrt(6 / (inp + out));
  return Float64Array.from({ length: out * inp }, () => (2 * random() - 1) * a);
}

function normal(random, n, std) {
  return Float64Array.from({ length: n }, () => random.normal() * std);
}

// model/: token tables N(0, d^-1/2); W^Q, W^K, W^V Glorot with gain 1/sqrt(2), W^O gain 1, attention biases 0;
// FFN weights Glorot, FFN biases nn.Linear's U(-1/sqrt(fan_in), 1/sqrt(fan_in)); LayerNorm 1 and 0; learned
// positions and the relative bias N(0, 0.02). Names and shapes as the state_dict (a tied head stored once).
export function initialWeights(cfg, random) {
  const t = new Map(), d = cfg.d_model, H = cfg.heads, dk = cfg.d_k, dv = cfg.d_v;
  const put = (name, shape, data) => t.set(name, { shape, data });
  const zeros = (n) => new Float64Array(n);
  put("src_embed.token.weight", [cfg.src_vocab, d], normal(random, cfg.src_vocab * d, d ** -0.5));
  if (cfg.positions === "learned") put("src_embed.learned.table.weight", [cfg.max_len, d], normal(random, cfg.max_len * d, 0.02));
  put("tgt_embed.token.weight", [cfg.tgt_vocab, d], normal(random, cfg.tgt_vocab * d, d ** -0.5));
  if (cfg.positions === "learned") put("tgt_embed.learned.table.weight", [cfg.max_len, d], normal(random, cfg.max_len * d, 0.02));
  const attention = (prefix, self) => {
    for (const [part, out, inp, gain] of [["w_q", H * dk, d, 0.5 ** 0.5], ["w_k", H * dk, d, 0.5 ** 0.5],
      ["w_v", H * dv, d, 0.5 ** 0.5], ["w_o", d, H * dv, 1]]) {
      put(`${prefix}.${part}.weight`, [out, inp], xavier(random, out, inp, gain));
      put(`${prefix}.${part}.bias`, [out], zeros(out));
    }
    if (self && cfg.positions === "relative") {
      const width = 2 * cfg.relative_clip + 1;
      put(`${prefix}.relative.bias`, [H, width], normal(random, H * width, 0.02));
    }
  };
  const layer = (prefix, cross) => {
    attention(`${prefix}.self_attention`, true);
    if (cross) attention(`${prefix}.cross_attention`, false);
    for (const [part, out, inp] of [["w_1", cfg.d_ff, d], ["w_2", d, cfg.d_ff]]) {
      put(`${prefix}.ffn.${part}.weight`, [out, inp], xavier(random, out, inp));
      put(`${prefix}.ffn.${part}.bias`, [out], Float64Array.from({ length: out }, () => (2 * random() - 1) / Math.sqrt(inp)));
    }
    for (let s = 0; s < (cross ? 3 : 2); s++) {
      put(`${prefix}.sublayer.${s}.layer_norm.weight`, [d], new Float64Array(d).fill(1));
      put(`${prefix}.sublayer.${s}.layer_norm.bias`, [d], zeros(d));
    }
  };
  for (let i = 0; i < cfg.encoder_layers; i++) layer(`encoder.layers.${i}`, false);
  const finalNorm = cfg.final_norm === null ? cfg.norm_placement === "pre" : cfg.final_norm;
  if (finalNorm) {
    put("encoder.norm.weight", [d], new Float64Array(d).fill(1));
    put("encoder.norm.bias", [d], zeros(d));
  }
  for (let i = 0; i < cfg.decoder_layers; i++) layer(`decoder.layers.${i}`, true);
  if (finalNorm) {
    put("decoder.norm.weight", [d], new Float64Array(d).fill(1));
    put("decoder.norm.bias", [d], zeros(d));
  }
  return t;
}

// ---- the optimiser and the schedule -------------------------------------------------------------------------

// lr at step t (from 1): linear warm-up lr t / warmup, then lr ("constant") or lr sqrt(warmup / t) ("inverse-sqrt")
export function learningRate(o, t) {
  if (t < o.warmup) return (o.lr * t) / o.warmup;
  return o.schedule === "inverse-sqrt" ? o.lr * Math.sqrt(o.warmup / t) : o.lr;
}

// torch.optim.Adam's arithmetic (its single-tensor path, no weight decay): per weight entry
//   m = m + (1 - b1) (g - m)      v = b2 v + (1 - b2) g^2
//   w = w - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
export class Adam {
  constructor(tensors, { betas = [0.9, 0.98], eps = 1e-9 } = {}) {
    this.tensors = [...tensors.values()];
    this.betas = betas;
    this.eps = eps;
    this.t = 0;
    this.m = this.tensors.map((w) => new Float64Array(w.data.length));
    this.v = this.tensors.map((w) => new Float64Array(w.data.length));
  }

  // grads: Map tensor -> Float64Array (a tensor with none has a zero gradient: its moments still decay)
  step(grads, lr) {
    this.t++;
    const [b1, b2] = this.betas, t = this.t;
    const stepSize = lr / (1 - b1 ** t), root2 = Math.sqrt(1 - b2 ** t);
    this.tensors.forEach((w, k) => {
      const g = grads.get(w), m = this.m[k], v = this.v[k], data = w.data;
      for (let i = 0; i < data.length; i++) {
        const gi = g ? g[i] : 0;
        m[i] += (1 - b1) * (gi - m[i]);
        v[i] = v[i] * b2 + (1 - b2) * gi * gi;
        data[i] -= stepSize * (m[i] / (Math.sqrt(v[i]) / root2 + this.eps));
      }
    });
  }
}

// torch.nn.utils.clip_grad_norm_: the norm of every gradient together; scaled by min(1, max / (norm + 1e-6))
export function clipGradients(grads, maxNorm) {
  let total = 0;
  for (const g of grads.values()) for (let i = 0; i < g.length; i++) total += g[i] * g[i];
  const norm = Math.sqrt(total), scale = Math.min(1, maxNorm / (norm + 1e-6));
  for (const g of grads.values()) for (let i = 0; i < g.length; i++) g[i] *= scale;
  return norm;
}

// One batch's loss and gradients: each pair {src, tgtIn, labels} (ids) on its own pass (no padding), every
// pass adding into one Map; the loss is divided by the batch's non-PAD labels, as a padded batch's. Returns
// {loss (the mean per token), grads: Map tensor -> Float64Array, predicted: argmax ids of every row}.
export function batchGradients(model, pairs, smoothing) {
  const count = pairs.reduce((n, p) => n + p.labels.filter((y) => y !== model.config.pad_id).length, 0);
  const grads = new Map();
  let loss = 0;
  const predicted = pairs.map(({ src, tgtIn, labels }) => {
    const pass = tapedPass(model, src, tgtIn, { weightGrads: grads });
    const objective = labelSmoothedLoss(pass.logits, labels, smoothing, model.config.pad_id, 1 / count);
    loss += objective.value;
    pass.backward(objective.grad);
    return argmaxRows(pass.logits);
  });
  return { loss, grads, predicted };
}

// One optimiser step of options `o` (label_smoothing, clip, lr, warmup, schedule) on `pairs`: the batch's
// gradients, clipped, then Adam at the schedule's rate for its next step. -> {loss, predicted}
export function trainStep(model, optimizer, pairs, o) {
  const { loss, grads, predicted } = batchGradients(model, pairs, o.label_smoothing);
  if (o.clip > 0) clipGradients(grads, o.clip);
  optimizer.step(grads, learningRate(o, optimizer.t + 1));
  return { loss, predicted };
}

function argmaxRows(logits) {
  const out = [];
  for (let i = 0; i < logits.rows; i++) {
    let best = 0;
    for (let c = 1; c < logits.cols; c++) if (logits.data[i * logits.cols + c] > logits.data[i * logits.cols + best]) best = c;
    out.push(best);
  }
  return out;
}

// ---- the trainer ----------------------------------------------------------------------------------------------

export class Trainer {
  constructor(opts = {}) {
    const o = (this.options = checkTrainOptions(opts));
    const task = (this.task = makeTask(o));
    this.vocab = task.vocab;
    this.ids = { source: new Map(task.vocab.source.map((w, i) => [w, i])), target: new Map(task.vocab.target.map((w, i) => [w, i])) };
    this.config = {
      src_vocab: task.vocab.source.length, tgt_vocab: task.vocab.target.length, d_model: o.d_model, heads: o.heads,
      d_k: o.d_model / o.heads, d_v: o.d_model / o.heads, d_ff: o.d_ff, encoder_layers: o.encoder_layers,
      decoder_layers: o.decoder_layers, dropout: 0.0, attention_dropout: 0.0, norm_placement: o.norm_placement,
      final_norm: null, eps: 1e-5, positions: o.positions, max_len: 32, relative_clip: 8, rope_base: 10000.0,
      scale_embeddings: true, scale_scores: true, position_layout: "interleaved", activation: "relu", bias: true,
      head_bias: false, tie_target: true, share_embeddings: false, family: "encoder-decoder", attention_path: "fast",
      pad_id: PAD, bos_id: BOS, eos_id: EOS,
    };
    this.tensors = initialWeights(this.config, stream(o.seed, 0));
    this.model = new Transformer(this.config, this.tensors);
    this.optimizer = new Adam(this.tensors);
    this.sets(stream(o.seed, 1));
    this.random = stream(o.seed, 2);                                   // the batches
    this.losses = [];
    this.stepCount = 0;
  }

  // the held-out and validation sequences: drawn first, distinct, never trained on (the grammar: a shuffled
  // split of its sentences)
  sets(random) {
    const o = this.options, key = (pair) => pair[0].join(" ");
    if (this.task.all) {
      const all = random.shuffle(this.task.all.slice());
      const n = Math.min(o.held_out, Math.floor(all.length / 5)), m = Math.min(o.validation, Math.floor(all.length / 5));
      this.heldOut = all.slice(0, n);
      this.validationSet = all.slice(n, n + m);
      this.trainPool = all.slice(n + m);
    } else {
      let space = 0;                                                   // distinct sources: symbols^n summed
      for (let n = o.min_length; n <= o.max_length; n++) space += o.symbols ** n;
      if (space < 2 * (o.held_out + o.validation)) {                   // training draws would rarely find a sequence
        throw invalid("held_out", `held_out + validation = ${o.held_out + o.validation} would take more than half of ` +
                      `the ${space} distinct sequences; ask for fewer, or for more symbols or longer sequences`);
      }
      const seen = new Set(), drawn = [];
      for (let tries = 0; drawn.length < o.held_out + o.validation && tries < 100 * (o.held_out + o.validation); tries++) {
        const pair = this.task.draw(random);
        if (!seen.has(key(pair))) {
          seen.add(key(pair));
          drawn.push(pair);
        }
      }
      if (drawn.length < o.held_out + o.validation) {
        throw invalid("held_out", `only ${drawn.length} distinct sequences exist for held_out + validation = ` +
                      `${o.held_out + o.validation}; ask for fewer or longer sequences`);
      }
      this.heldOut = drawn.slice(0, o.held_out);
      this.validationSet = drawn.slice(o.held_out);
      this.trainPool = null;
    }
    this.excluded = new Set([...this.heldOut, ...this.validationSet].map(key));
    // the example shown (and returned by train()): the first held-out pair of the greatest source length, where
    // the alignment has the most rows to show (one odd row of six is a sixth of a short example's rows)
    const longest = Math.max(...this.heldOut.map(([source]) => source.length));
    this.shown = this.heldOut.findIndex(([source]) => source.length === longest);
  }

  // a training pair that is in neither set (the grammar draws from its training split)
  drawTraining() {
    if (this.trainPool) return this.trainPool[this.random.int(this.trainPool.length)];
    for (;;) {
      const pair = this.task.draw(this.random);
      if (!this.excluded.has(pair[0].join(" "))) return pair;
    }
  }

  // [source words, target words] -> {src, tgtIn, labels}: BOS + target as the decoder's input, target + EOS as
  // its labels (the lesson's right shift)
  encodePair([source, target]) {
    const tgt = target.map((w) => this.ids.target.get(w));
    return { src: source.map((w) => this.ids.source.get(w)), tgtIn: [BOS, ...tgt], labels: [...tgt, EOS] };
  }

  learningRate(t = this.stepCount + 1) {
    return learningRate(this.options, t);
  }

  // one optimiser step on a fresh batch: every target position of every sequence at once (teacher forcing)
  step() {
    const o = this.options;
    const words = Array.from({ length: o.batch }, () => this.drawTraining());
    const pairs = words.map((pair) => this.encodePair(pair));
    const { loss, predicted } = trainStep(this.model, this.optimizer, pairs, o);
    this.stepCount++;
    this.losses.push(loss);
    const word = (ids) => ids.map((id) => this.vocab.target[id]);
    return {
      step: this.stepCount, loss,
      batch: { source: words.map(([s]) => s), targetIn: pairs.map((p) => word(p.tgtIn)),
        targetOut: pairs.map((p) => word(p.labels)), predicted: predicted.map(word) },
    };
  }

  // a sequence right when every teacher-forced argmax is its target (then greedy decoding, which sees the same
  // right prefix at each step, writes exactly the target and EOS): the exact-match rate over `set`
  solvedShare(set) {
    let right = 0;
    for (const pair of set) {
      const p = this.encodePair(pair);
      const { logits } = this.model.forward(p.src, p.tgtIn);
      if (logits.every((row, i) => argmaxRows(matrix(1, row.length, row))[0] === p.labels[i])) right++;
    }
    return right / set.length;
  }

  validate() {
    return this.solvedShare(this.validationSet);
  }

  // exact-match rate of greedy outputs on the held-out sequences (the first `limit`)
  evaluate(limit = this.heldOut.length) {
    const set = this.heldOut.slice(0, limit);
    let right = 0;
    for (const pair of set) {
      const p = this.encodePair(pair);
      const out = generate(this.model, p.src, { beam: 1 });
      if (out.finished && out.tokens.length === p.labels.length - 1 && out.tokens.every((id, i) => id === p.labels[i])) right++;
    }
    return right / set.length;
  }

  // held-out example i (default: the one shown, the first of the greatest length): the greedy output, the
  // teacher-forced argmax, and the last decoder layer's cross-attention (mean over heads): one row per target
  // token (the row whose output it is), one column per source token
  example(i = this.shown) {
    const pair = this.heldOut[i % this.heldOut.length], p = this.encodePair(pair);
    const L = this.config.decoder_layers - 1;
    const { logits, probes } = this.model.forward(p.src, p.tgtIn, { record: [`decoder.${L}.cross_attention.head.*.weights`] });
    const heads = [...probes.values()];
    const crossAttention = pair[1].map((_, r) => pair[0].map((_, j) => heads.reduce((s, w) => s + w.data[r * w.cols + j], 0) / heads.length));
    const word = (ids) => ids.map((id) => this.vocab.target[id]);
    const out = generate(this.model, p.src, { beam: 1 });
    return { source: pair[0], target: pair[1], greedy: word(out.tokens), teacherForced: word(logits.map((row) => argmaxRows(matrix(1, row.length, row))[0])),
      cross_attention: crossAttention };
  }
}

// A run stops when the validation set is solved at this many checks in a row (one solved check can be luck: a
// model right on 99.3 % of sequences gets 200 of 200 one time in four)
export const SOLVED_CHECKS = 2;

// Train `trainer` until its options' `steps`, `seconds` or (stop_when_solved) the validation set solved,
// checked every eval_every steps. now(): milliseconds (performance.now or Date.now, injected: Node and a worker
// share the code); onProgress({step, loss, seconds, validation}) after each check; shouldStop() ends the run
// early. Returns what window.glassformer.train() resolves to (plain JSON).
export function trainUntilDone(trainer, { now = () => performance.now(), onProgress, shouldStop } = {}) {
  const o = trainer.options, start = now(), first = trainer.stepCount;
  const seconds = () => (now() - start) / 1000;
  let validation = null, solved = 0;                                 // checks in a row with every sequence right
  while (trainer.stepCount < o.steps && seconds() < o.seconds && !(shouldStop && shouldStop())) {
    trainer.step();
    if (trainer.stepCount % o.eval_every === 0 || trainer.stepCount === o.steps) {
      validation = trainer.validate();
      solved = validation === 1 ? solved + 1 : 0;
      if (onProgress) onProgress({ step: trainer.stepCount, loss: trainer.losses[trainer.stepCount - 1], seconds: seconds(), validation });
      if (o.stop_when_solved && solved === SOLVED_CHECKS) break;
    }
  }
  const trained = seconds();
  const example = trainer.example();
  return { steps: trainer.stepCount - first, seconds: trained, loss: trainer.losses.slice(first), accuracy: trainer.evaluate(),
    validation, example: { source: example.source, target: example.target, cross_attention: example.cross_attention } };
}

// A fresh Trainer of `opts`, trained (trainUntilDone)
export function runTraining(opts = {}, clock = {}) {
  return trainUntilDone(new Trainer(opts), clock);
}
