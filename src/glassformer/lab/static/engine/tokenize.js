// glassformer lab engine: the tokenizers of a run folder's vocab.json, in the page.
//
// Source side: SourceTokenizer cuts Chinese text into the training units exactly as
// glassformer.data.tokenize.SourceTokenizer does (typed separators ／ / and spaces win, punctuation
// normalised to the corpus's full-width forms, each punctuation mark or symbol a unit of its own, Han
// runs cut by the most probable split over the training words, ties to the longer last word, an unknown
// character a unit of its own that encodes as <unk>).
// Target side: TargetTokenizer is the `tokenizers` JSON the run saved (BPE or WordLevel model, Metaspace +
// Punctuation pre-tokenizer, Metaspace decoder), re-implemented for the parts glassformer uses.
// No dependency; strings are walked by code point (as Python does), never by UTF-16 unit.

export const SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"];
export const PAD_ID = 0;
export const BOS_ID = 1;
export const EOS_ID = 2;
export const UNK_ID = 3;

// ---------------------------------------------------------------- character classes (Python's)
// str.isspace(): bidi class WS, B, S or category Zs (not U+FEFF, unlike JavaScript's \s)
const PY_SPACES = new Set([0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x85, 0xa0, 0x1680,
  0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a,
  0x2028, 0x2029, 0x202f, 0x205f, 0x3000]);
const PUNCT_OR_SYMBOL = /^[\p{P}\p{S}]$/u;
const CONTROL_OR_FORMAT = /^[\p{Cc}\p{Cf}]$/u;
const ASCII_TO_FULLWIDTH = { ",": "，", "!": "！", "?": "？", ";": "；", ":": "：", "(": "（", ")": "）" };

export function isSpace(ch) { return PY_SPACES.has(ch.codePointAt(0)); }

/** Punctuation or symbol (Chinese or ASCII, also emoji): always a unit of its own. */
export function isPunct(ch) { return PUNCT_OR_SYMBOL.test(ch); }

/** A CJK ideograph: the characters the word segmenter works on. */
export function isHan(ch) {
  const code = ch.codePointAt(0);
  return (code >= 0x4e00 && code <= 0x9fff) || (code >= 0x3400 && code <= 0x4dbf) || (code >= 0xf900 && code <= 0xfaff)
    || (code >= 0x20000 && code <= 0x323af);
}

function isDropped(ch) {                 // control/format characters and emoji variation selectors carry no unit
  const code = ch.codePointAt(0);
  return CONTROL_OR_FORMAT.test(ch) || (code >= 0xfe00 && code <= 0xfe0f);
}

function pyStrip(text) {                 // str.strip(): whitespace in Python's sense off both ends
  const chars = Array.from(text);
  let a = 0; let b = chars.length;
  while (a < b && isSpace(chars[a])) a++;
  while (b > a && isSpace(chars[b - 1])) b--;
  return chars.slice(a, b).join("");
}

function isSeparator(ch) { return ch === "／" || ch === "/" || isSpace(ch); }

/** Split at runs of separators (re.split(r"[／/\s]+", text)): a leading or trailing run gives an empty piece. */
function splitSeparators(text) {
  const pieces = [];
  let buf = ""; let inSep = false;
  for (const ch of text) {
    if (isSeparator(ch)) { if (!inSep) { pieces.push(buf); buf = ""; inSep = true; } }
    else { buf += ch; inSep = false; }
  }
  pieces.push(buf);
  return pieces;
}

/** ASCII , ! ? ; : ( ) to full-width, and '.' after a Han character to '。' (the corpus forms). */
export function normalizePunct(text) {
  const chars = Array.from(text);
  return chars.map((ch, i) => (ch === "." && i > 0 && isHan(chars[i - 1]) ? "。" : (ASCII_TO_FULLWIDTH[ch] || ch))).join("");
}

/** Cut text into [run, isHanRun]: each punctuation/symbol alone, Han runs, other runs (Latin, digits). */
export function splitRuns(text) {
  const runs = [];
  let kindPrev = ""; let buf = "";
  for (const ch of text) {
    let kind;
    if (isDropped(ch) || isSpace(ch)) kind = "gap";
    else if (isPunct(ch)) kind = "punct";
    else kind = isHan(ch) ? "han" : "other";
    if (kind !== kindPrev || kind === "punct") {
      if (buf) runs.push([buf, kindPrev === "han"]);
      buf = "";
    }
    if (kind !== "gap") buf += ch;
    kindPrev = kind;
  }
  if (buf) runs.push([buf, kindPrev === "han"]);
  return runs;
}

// ---------------------------------------------------------------- segmenters over a vocabulary
/** Word log-probabilities (training frequency / total) and the below-any-word score of an unknown character. */
function logProbs(counts) {
  let total = 0;
  for (const c of counts.values()) total += c;
  total = total || 1;
  const logps = new Map();
  for (const [w, c] of counts) logps.set(w, Math.log(c / total));
  return { logps, unknown: Math.log(0.5 / total) };
}

/** Most probable split of a run into known words; ties go to the longer last word (as the Python segmenter). */
function segmentUnigram(run, scores, maxLen) {
  const chars = Array.from(run);
  const n = chars.length;
  const best = [[0, 0]];                                     // [score, last word length] per end position
  for (let i = 0; i < n; i++) best.push([-Infinity, 1]);
  for (let end = 1; end <= n; end++) {
    for (let length = 1; length <= Math.min(maxLen, end); length++) {
      let logp = scores.logps.get(chars.slice(end - length, end).join(""));
      if (logp === undefined) {
        if (length > 1) continue;
        logp = scores.unknown;
      }
      const score = best[end - length][0] + logp;
      if (score >= best[end][0]) best[end] = [score, length];
    }
  }
  const units = [];
  for (let end = n; end > 0;) {
    const length = best[end][1];
    units.push(chars.slice(end - length, end).join(""));
    end -= length;
  }
  return units.reverse();
}

function segmentFmm(run, words, maxLen) {                  // forward maximum matching
  const chars = Array.from(run); const units = [];
  for (let i = 0; i < chars.length;) {
    let length = 1;
    for (let n = Math.min(maxLen, chars.length - i); n > 1; n--) {
      if (words.has(chars.slice(i, i + n).join(""))) { length = n; break; }
    }
    units.push(chars.slice(i, i + length).join("")); i += length;
  }
  return units;
}

function segmentBmm(run, words, maxLen) {                  // backward maximum matching
  const chars = Array.from(run); const units = [];
  for (let end = chars.length; end > 0;) {
    let length = 1;
    for (let n = Math.min(maxLen, end); n > 1; n--) {
      if (words.has(chars.slice(end - n, end).join(""))) { length = n; break; }
    }
    units.push(chars.slice(end - length, end).join("")); end -= length;
  }
  return units.reverse();
}

// ---------------------------------------------------------------- source tokenizer
/** Chinese text -> units -> ids, from vocab.json's "source" entry ({type: "SourceTokenizer", mode, vocab}). */
export class SourceTokenizer {
  constructor(data) {
    if (!data || data.type !== "SourceTokenizer") {
      throw new Error(`not a SourceTokenizer: type=${data && data.type}` +
        (data && data.type === "sentencepiece" ? " (SentencePiece source models need the server)" : ""));
    }
    const tokens = data.vocab && data.vocab.tokens;
    if (!Array.isArray(tokens) || SPECIAL_TOKENS.some((s, i) => tokens[i] !== s)) {
      throw new Error(`source vocabulary must start with ${SPECIAL_TOKENS.join(" ")}`);
    }
    if (!["unigram", "fmm", "bmm", "char"].includes(data.mode)) throw new Error(`unknown source mode ${data.mode}`);
    this.mode = data.mode;
    this.itos = [];
    this.stoi = new Map();
    for (const token of tokens) {
      if (!this.stoi.has(token)) { this.stoi.set(token, this.itos.length); this.itos.push(token); }
    }
    const counts = data.vocab.counts || {};
    this.words = new Map();                                  // Han words with their training counts
    let maxLen = 0;
    for (const w of this.itos.slice(SPECIAL_TOKENS.length)) {
      if (Array.from(w).every(isHan)) {
        this.words.set(w, Object.prototype.hasOwnProperty.call(counts, w) ? counts[w] : 1);
        maxLen = Math.max(maxLen, Array.from(w).length);
      }
    }
    this.maxLen = maxLen || 1;
    this.scores = logProbs(this.words);
  }

  get vocabSize() { return this.itos.length; }

  has(unit) { return this.stoi.has(unit) && !SPECIAL_TOKENS.includes(unit); }

  tokenToId(unit) { return this.stoi.has(unit) ? this.stoi.get(unit) : UNK_ID; }

  segmentHan(run) {
    if (this.mode === "char") return Array.from(run);
    if (this.mode === "fmm") return segmentFmm(run, this.words, this.maxLen);
    if (this.mode === "bmm") return segmentBmm(run, this.words, this.maxLen);
    return segmentUnigram(run, this.scores, this.maxLen);
  }

  static isPresegmented(text) { return Array.from(pyStrip(text)).some(isSeparator); }

  /** Units of text: typed separators are unit boundaries; a typed piece that is no known unit, and raw text, are cut. */
  segment(text) {
    text = normalizePunct(pyStrip(text));
    const typed = Array.from(text).some(isSeparator);
    const units = [];
    for (const piece of typed ? splitSeparators(text) : [text]) {
      for (const [run, han] of splitRuns(piece)) {
        if (han && !(typed && this.has(run))) units.push(...this.segmentHan(run));
        else units.push(run);
      }
    }
    return units;
  }

  /** {units, ids, unknown, presegmented}: `unknown` lists the units that encode as <unk>, as translate --verbose. */
  analyse(text) {
    const units = this.segment(text);
    const ids = units.map((u) => this.tokenToId(u));
    const unknown = units.filter((u, i) => ids[i] === UNK_ID);
    return { units, ids, unknown, presegmented: SourceTokenizer.isPresegmented(text) };
  }

  encode(text) { return this.analyse(text).ids; }

  decode(ids) { return ids.filter((i) => i !== PAD_ID && i !== BOS_ID && i !== EOS_ID).map((i) => this.itos[i]); }
}

// ---------------------------------------------------------------- target tokenizer (`tokenizers` JSON)
// char::is_ascii_punctuation || Unicode punctuation (Pc Pd Pe Pf Pi Po Ps): tokenizers' Punctuation pre-tokenizer
const PUNCTUATION = /^[\p{P}!-/:-@[-`{-~]$/u;

function metaspaceSplit(piece, step, isFirst) {        // Metaspace: ' ' -> ▁, a ▁ in front, split before each ▁
  const rep = step.replacement || "▁";
  let text = piece.split(" ").join(rep);
  const scheme = step.prepend_scheme || (step.add_prefix_space === false ? "never" : "always");
  if (text && !text.startsWith(rep) && (scheme === "always" || (scheme === "first" && isFirst))) text = rep + text;
  if (step.split === false) return text ? [text] : [];
  const out = [];
  let buf = "";
  for (const ch of text) {
    if (ch === rep && buf) { out.push(buf); buf = ""; }
    buf += ch;
  }
  if (buf) out.push(buf);
  return out;
}

function punctuationSplit(piece, step) {               // Punctuation: behavior isolated (each mark alone)
  const behavior = String(step.behavior || "Isolated").toLowerCase();
  if (behavior !== "isolated") throw new Error(`Punctuation behavior ${step.behavior} is not supported in the page`);
  const out = [];
  let buf = "";
  for (const ch of piece) {
    if (PUNCTUATION.test(ch)) { if (buf) out.push(buf); out.push(ch); buf = ""; } else buf += ch;
  }
  if (buf) out.push(buf);
  return out;
}

/** English sub-words: the `tokenizers` JSON string vocab.json's "target" entry holds. */
export class TargetTokenizer {
  constructor(data) {
    if (!data || data.type !== "TargetTokenizer") {
      throw new Error(`not a TargetTokenizer: type=${data && data.type}` +
        (data && data.type === "sentencepiece" ? " (SentencePiece target models need the server)" : ""));
    }
    const json = typeof data.tokenizer === "string" ? JSON.parse(data.tokenizer) : data.tokenizer;
    const model = json.model || {};
    if (json.normalizer) throw new Error(`target normalizer ${json.normalizer.type} is not supported in the page`);
    this.kind = model.type;
    if (this.kind !== "BPE" && this.kind !== "WordLevel") throw new Error(`target model ${model.type} is not supported in the page`);
    if (this.kind === "BPE" && (model.continuing_subword_prefix || model.end_of_word_suffix || model.byte_fallback
        || model.fuse_unk || model.ignore_merges || model.dropout)) {
      throw new Error("this BPE's options are not supported in the page");
    }
    this.vocab = new Map(Object.entries(model.vocab || {}));
    this.unkToken = model.unk_token === undefined ? null : model.unk_token;
    this.itos = new Map();
    for (const [token, id] of this.vocab) this.itos.set(id, token);
    this.added = new Map();                                  // id -> {content, special}
    for (const a of json.added_tokens || []) this.added.set(a.id, { content: a.content, special: !!a.special });
    this.addedByContent = new Map([...this.added.entries()].map(([id, a]) => [a.content, id]));
    this.addedContents = [...this.addedByContent.keys()].filter((s) => s.length).sort((a, b) => b.length - a.length);
    this.merges = new Map();                                 // "a\u0000b" -> rank
    (model.merges || []).forEach((m, rank) => {
      const [a, b] = Array.isArray(m) ? m : splitMerge(m);
      this.merges.set(a + "\u0000" + b, rank);
    });
    const pre = json.pre_tokenizer;
    this.steps = !pre ? [] : pre.type === "Sequence" ? pre.pretokenizers : [pre];
    for (const s of this.steps) {
      if (s.type !== "Metaspace" && s.type !== "Punctuation") throw new Error(`pre-tokenizer ${s.type} is not supported in the page`);
    }
    this.decoder = json.decoder || null;
    if (this.decoder && this.decoder.type !== "Metaspace") throw new Error(`decoder ${this.decoder.type} is not supported in the page`);
    for (const [i, s] of SPECIAL_TOKENS.entries()) {
      if (this.tokenToId(s) !== i) throw new Error(`special token ${s} must have id ${i}`);
    }
  }

  get vocabSize() {                                          // get_vocab_size(): the model's and the added tokens
    const ids = new Set([...this.itos.keys(), ...this.added.keys()]);
    return ids.size;
  }

  tokenToId(token) {
    if (this.addedByContent.has(token)) return this.addedByContent.get(token);
    return this.vocab.has(token) ? this.vocab.get(token) : null;
  }

  idToToken(id) {
    if (this.added.has(id)) return this.added.get(id).content;
    return this.itos.has(id) ? this.itos.get(id) : null;
  }

  /** The text cut at added (special) tokens, leftmost-longest: [[piece, addedId | null], ...]. */
  splitAdded(text) {
    const out = [];
    let buf = ""; let i = 0;
    while (i < text.length) {
      const hit = this.addedContents.find((s) => text.startsWith(s, i));
      if (hit) { if (buf) out.push([buf, null]); buf = ""; out.push([hit, this.addedByContent.get(hit)]); i += hit.length; }
      else { buf += text[i]; i += 1; }
    }
    if (buf) out.push([buf, null]);
    return out;
  }

  /** Pre-tokenized words of one piece of text (between added tokens). */
  words(piece, isFirst) {
    let words = [piece];
    for (const step of this.steps) {
      words = words.flatMap((w) => (step.type === "Metaspace" ? metaspaceSplit(w, step, isFirst) : punctuationSplit(w, step)));
    }
    return words;
  }

  /** Ids of one pre-tokenized word. */
  model(word) {
    const unk = this.unkToken === null ? null : this.tokenToId(this.unkToken);
    if (this.kind === "WordLevel") {
      if (this.vocab.has(word)) return [this.vocab.get(word)];
      if (unk === null) throw new Error(`WordLevel: ${word} is not in the vocabulary and there is no unknown token`);
      return [unk];
    }
    let symbols = [];                                        // [token text | null (unknown), id]
    for (const ch of word) {
      if (this.vocab.has(ch)) symbols.push([ch, this.vocab.get(ch)]);
      else if (unk !== null) symbols.push([null, unk]);
    }
    for (;;) {                                               // the lowest-ranked merge first, leftmost on ties
      let bestRank = Infinity; let at = -1;
      for (let i = 0; i + 1 < symbols.length; i++) {
        if (symbols[i][0] === null || symbols[i + 1][0] === null) continue;
        const rank = this.merges.get(symbols[i][0] + "\u0000" + symbols[i + 1][0]);
        if (rank !== undefined && rank < bestRank && this.vocab.has(symbols[i][0] + symbols[i + 1][0])) { bestRank = rank; at = i; }
      }
      if (at < 0) break;
      const merged = symbols[at][0] + symbols[at + 1][0];
      symbols = [...symbols.slice(0, at), [merged, this.vocab.get(merged)], ...symbols.slice(at + 2)];
    }
    return symbols.map((s) => s[1]);
  }

  /** Sub-word ids of text (no BOS/EOS), as TargetTokenizer.encode. */
  encode(text) {
    const ids = [];
    this.splitAdded(text).forEach(([piece, addedId], k) => {
      if (addedId !== null) { ids.push(addedId); return; }
      for (const word of this.words(piece, k === 0)) ids.push(...this.model(word));
    });
    return ids;
  }

  tokens(text) { return this.encode(text).map((id) => this.idToToken(id)); }

  /** English text: stops at the first EOS, drops special tokens, restores spaces (Metaspace decoder). */
  decode(ids) {
    const cut = ids.indexOf(EOS_ID) >= 0 ? ids.slice(0, ids.indexOf(EOS_ID)) : ids;
    return this.decodeAll(cut);
  }

  decodeAll(ids) {
    const tokens = [];
    for (const id of ids) {
      const token = this.idToToken(id);
      if (token === null) continue;
      if (this.added.has(id) && this.added.get(id).special) continue;
      tokens.push(token);
    }
    if (!this.decoder) return tokens.join(" ");
    const rep = this.decoder.replacement || "▁";
    const scheme = this.decoder.prepend_scheme || (this.decoder.add_prefix_space === false ? "never" : "always");
    return tokens.map((token, i) => Array.from(token).map((c) => (c === rep ? (i === 0 && scheme !== "never" ? "" : " ") : c)).join(""))
      .join("");
  }

  /** A target id as readable text (lab/models.py LabModel.piece): sub-word marks removed, specials by name. */
  piece(id, cfg) {
    const token = this.idToToken(id);
    if (token === null) return `<${id}>`;
    const c = cfg || {};
    if (SPECIAL_TOKENS.includes(token) || id === (c.pad_id ?? PAD_ID) || id === (c.bos_id ?? BOS_ID) || id === (c.eos_id ?? EOS_ID)) {
      return token;
    }
    return pyStrip(this.decode([id])) || pyStrip(token.split("▁").join(" ")) || token;
  }
}

function splitMerge(m) {                                   // the older merges format "a b"
  const i = m.indexOf(" ", 1);
  return [m.slice(0, i), m.slice(i + 1)];
}

/** Both tokenizers of a run folder's vocab.json ({source, target}). */
export function loadTokenizers(vocab) {
  if (!vocab || typeof vocab !== "object") throw new Error("vocab.json: not an object");
  return { source: new SourceTokenizer(vocab.source), target: new TargetTokenizer(vocab.target) };
}
