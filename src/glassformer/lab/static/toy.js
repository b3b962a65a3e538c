// glassformer lab: a toy trained in the Train view, opened in the other views like the translator.
// Its vocabulary is a list of symbols (index = id, specials included); a sentence is its symbols separated by
// spaces (or ／ and /, as the translator's units). toySession builds what live.js needs from the weights the
// worker's trainer sends: the engine model, the tokenizers, the model's description and the views' defaults.
import { Transformer } from "./engine/index.js";

const SEPARATORS = /[\s／/]+/u;
const WORD_START = "▁";                               // target symbols read as whole words (as a BPE's ▁ pieces)

/** Symbols <-> ids for one side of a toy (the interface live.js uses of the translator's tokenizers). */
export class ToyTokenizer {
  constructor(symbols, cfg, side) {
    this.itos = symbols.slice();
    this.side = side;
    this.stoi = new Map(symbols.map((s, i) => [s, i]));
    this.specials = new Set([cfg.pad_id, cfg.bos_id, cfg.eos_id].filter((i) => i !== undefined && i !== null));
    this.eos = cfg.eos_id;
    this.unk = this.stoi.has("<unk>") ? this.stoi.get("<unk>") : null;
  }

  get vocabSize() { return this.itos.length; }

  /** The symbols a sentence may use (specials left out). */
  symbols() { return this.itos.filter((s, i) => !this.specials.has(i) && i !== this.unk); }

  has(unit) { return this.stoi.has(unit) && !this.specials.has(this.stoi.get(unit)); }

  tokenToId(unit) { return this.has(unit) ? this.stoi.get(unit) : this.unk; }

  /** {units, ids, unknown}: an unknown symbol's id is <unk>'s, or null when the toy has none (the caller refuses it). */
  analyse(text) {
    const units = String(text).trim().split(SEPARATORS).filter(Boolean);
    const ids = units.map((u) => this.tokenToId(u));
    const unknown = units.filter((u) => !this.has(u));
    return { units, ids, unknown, presegmented: true };
  }

  encode(text) { return this.analyse(text).ids; }

  idToToken(id) {
    const s = this.itos[id];
    if (s === undefined) return null;
    return this.side === "target" && !this.specials.has(id) && id !== this.unk ? WORD_START + s : s;
  }

  tokens(text) { return this.encode(text).map((id) => (id === null ? null : this.idToToken(id))); }

  decodeAll(ids) { return ids.filter((i) => !this.specials.has(i) && this.itos[i] !== undefined).map((i) => this.itos[i]).join(" "); }

  decode(ids) {
    const cut = ids.indexOf(this.eos);
    return this.decodeAll(cut >= 0 ? ids.slice(0, cut) : ids);
  }

  piece(id) { return this.itos[id] === undefined ? `<${id}>` : this.itos[id]; }
}

const CONFIG_KEYS = ["d_model", "heads", "d_k", "d_v", "d_ff", "encoder_layers", "decoder_layers", "norm_placement",
  "positions", "max_len"];

/** The views' session for a toy: {model, config, tensors, source, target, noPositions, info, viewInfo}.
 * weights: {config, vocab: {source, target}, tensors: [[name, {shape, data}]], step} from the worker's trainer;
 * meta: {task, accuracy, example: {source, target}, label: {zh, en}} from the Train view. */
export function toySession(weights, meta, limits) {
  const config = weights.config;
  const tensors = new Map(weights.tensors);
  const model = new Transformer(config, tensors);
  let twin = null;
  const noPositions = () => (twin = twin || new Transformer(Object.assign({}, config, { positions: "none" }), tensors));
  const source = new ToyTokenizer(weights.vocab.source, config, "source");
  const target = new ToyTokenizer(weights.vocab.target, config, "target");
  let parameters = 0;
  for (const t of tensors.values()) parameters += t.data.length;
  const info = {
    trained: true, toy: true, origin: `toy: ${meta.task}, ${weights.step} steps in the page`, label: meta.label, parameters,
    config: Object.fromEntries(CONFIG_KEYS.map((k) => [k, config[k]])), src_vocab: config.src_vocab, tgt_vocab: config.tgt_vocab,
  };
  const plain = (tokens, side) => tokens.filter((tok) => side.has(tok));          // specials (PAD, BOS, EOS) left out
  const src = plain(meta.example.source, source);
  const tgt = plain(meta.example.target, target);
  // the Patching view's corruption: the first source symbol replaced by one the sentence does not use; the word
  // to predict: that symbol's place in the target, where the task moves it (else the first target word)
  const spare = source.symbols().find((s) => !src.includes(s)) || source.symbols().find((s) => s !== src[0]);
  const corrupt = [spare, ...src.slice(1)];
  const predict = tgt.includes(src[0]) ? src[0] : tgt[0];
  const pair = src.length > 1 && src[0] !== src[1] ? [src[0], src[1]] : [src[0], spare];
  const viewInfo = {
    model: info, default_source: src.join(" "), default_target: tgt.join(" "), patch_corrupt: corrupt.join(" "),
    patch_predict: predict, swap: pair,
    toy: { task: meta.task, step: weights.step, accuracy: meta.accuracy },
  };
  return { toy: true, config, model, tensors, vocab: weights.vocab, noPositions, source, target, limits, info, viewInfo };
}
