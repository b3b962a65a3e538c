// glassformer lab: the trained translator in the page. Loads the model bundle (embedded in the exported file,
// GET api/bundle when served), builds the engine (engine/) and its tokenizers, and offers
//   window.glassformer = {ready, translate(text, {beam}), next(source, targetPrefix, {off}), analyse(text),
//                         attribute(source, target, {method, steps, contrast}), train({task, seed, seconds, ...})}
// for scripts, and window.LAB_LIVE (the same session plus what the views compute) for the lab's views.
// Everything runs in float64. Short work runs on the page's thread (long patching yields between runs); gradient
// attribution, attribution patching and training run in a Web Worker (worker.js) holding its own copy of the model.
// A toy trained in the Train view can take the translator's place in the views (useToy / useTranslator).
import { loadBundle, Transformer, generate, nextDistribution, patchingScan, logitLens, runTrace, softmaxRow,
  attributionTarget, targetPieces, baselineName, ATTRIBUTION_METHODS, AUTO_STEPS, checkTrainOptions, TRAIN_DEFAULTS,
  TASKS } from "./engine/index.js";
import { loadTokenizers, UNK_ID } from "./engine/tokenize.js";
import { newExerciseSheet, exerciseKey, runExerciseWithBug, checkExercise, parseExerciseTable, exerciseBug, exerciseNotCovered } from "./engine/exercises.js";
import { toySession } from "./toy.js";
import { unpackWeights, base64Of } from "./pack.js";

const EMBED = window.LAB_EMBED || null;             // the exported page's precomputed data (app.js reads it too)

class LiveError extends Error {
  constructor(message, field) { super(message); this.field = field; }
}

const pause = () => new Promise((resolve) => setTimeout(resolve, 0));   // let the page paint and answer clicks
const thousands = (n) => n.toLocaleString("en-US");

// ---------------------------------------------------------------- loading
async function readPayload() {
  if (EMBED) {                                       // the exported file: the bundle is the page's last element
    const node = document.getElementById("lab-bundle");
    if (!node) throw new LiveError("this file is damaged: the model at its end is missing (copy it again, or export it again)", "file");
    const text = node.textContent;
    const want = Number(node.dataset.chars);
    if (want && text.length !== want) {
      throw new LiveError(`this file is damaged: its model has ${thousands(text.length)} of ${thousands(want)} characters `
        + "(cut short while copying? copy it again, or export it again)", "file");
    }
    let payload;
    try { payload = JSON.parse(text); } catch (e) { throw new LiveError(`this file is damaged: its model is not valid JSON (${e.message})`, "file"); }
    const packed = payload && payload.bundle && payload.bundle.packed;
    if (packed) {                                    // the weights, packed (lab/bundle.py pack_weights), come last
      const weights = document.getElementById("lab-weights");
      const chars = weights ? weights.textContent : "";
      if (!weights || chars.length !== Number(weights.dataset.chars)) {
        throw new LiveError(`this file is damaged: its weights have ${thousands(chars.length)} of `
          + `${thousands(Number(weights ? weights.dataset.chars : 0))} characters (cut short while copying? copy it again, or export it again)`, "file");
      }
      let bytes;
      try { bytes = await unpackWeights(chars, packed); } catch (e) { throw new LiveError(e.message, "file"); }
      payload.bundle = Object.assign({}, payload.bundle, { data: base64Of(bytes) });
      delete payload.bundle.packed;
    }
    return payload;
  }
  const response = await fetch("api/bundle");
  let data = null;
  try { data = await response.json(); } catch (e) { data = { error: response.statusText }; }
  if (!response.ok) throw new LiveError(data.error || response.statusText, data.field || "model");
  return data;
}

async function start() {
  const payload = await readPayload();
  if (payload && payload.unsupported) throw new LiveError(payload.unsupported, "model");   // the server runs it
  if (!payload || typeof payload !== "object" || !payload.bundle) throw new LiveError("model bundle: missing (the file is damaged)", "file");
  await pause();
  let loaded;
  try { loaded = loadBundle(payload.bundle); } catch (e) { throw new LiveError(e.message, "file"); }
  const { source, target } = loadTokenizers(loaded.vocab);
  const config = loaded.config;
  const model = new Transformer(config, loaded.tensors);
  let twin = null;                                   // the same weights with positions "none" (claim C1)
  const noPositions = () => (twin = twin || new Transformer(Object.assign({}, config, { positions: "none" }), loaded.tensors));
  return { config, model, tensors: loaded.tensors, vocab: loaded.vocab, noPositions, source, target,
    limits: payload.limits || {}, info: payload.model || null };
}

// ---------------------------------------------------------------- the worker
// Served: worker.js as a module worker. Exported: the file carries worker.js and the engine inlined as one script
// (the text of the script element #lab-worker), started from a Blob URL, so nothing is requested.
let workerUrl = null;

function startWorker() {
  const inline = document.getElementById("lab-worker");
  if (inline) {
    workerUrl = workerUrl || URL.createObjectURL(new Blob([inline.textContent], { type: "text/javascript" }));
    return new Worker(workerUrl);
  }
  return new Worker("worker.js", { type: "module" });
}

/** One worker and its calls: call(op, message, onProgress) -> Promise of the answer; an error is a LiveError. */
class Job {
  constructor() {
    this.calls = new Map();
    this.count = 0;
    this.listeners = {};
    this.failed = null;
    try { this.worker = startWorker(); } catch (e) {
      this.worker = null;
      this.failed = new LiveError(`the page's worker did not start: ${e.message}`, "worker");
      return;
    }
    this.worker.onmessage = (event) => this.receive(event.data);
    this.worker.onerror = (event) => {
      event.preventDefault();
      this.fail(new LiveError(`the page's worker stopped: ${event.message || "it could not start"}`, "worker"));
    };
  }

  call(op, message, onProgress) {
    if (this.failed) return Promise.reject(this.failed);
    const id = ++this.count;
    return new Promise((resolve, reject) => {
      this.calls.set(id, { resolve, reject, onProgress });
      try { this.worker.postMessage(Object.assign({ id, op }, message)); } catch (e) {
        this.calls.delete(id);
        reject(new LiveError(`${op}: ${e.message}`, "options"));
      }
    });
  }

  receive(m) {
    if (m.id === undefined) { const listener = this.listeners[m.op]; if (listener) listener(m.update); return; }
    const call = this.calls.get(m.id);
    if (!call) return;
    if (m.progress !== undefined) { if (call.onProgress) call.onProgress(m.progress); return; }
    this.calls.delete(m.id);
    if (m.error) call.reject(new LiveError(m.error.message, m.error.field || undefined));
    else call.resolve(m.value);
  }

  fail(err) {
    this.failed = err;
    for (const call of this.calls.values()) call.reject(err);
    this.calls.clear();
  }

  close() {
    if (this.worker) this.worker.terminate();
    this.fail(new LiveError("the page's worker was stopped", "worker"));
  }
}

/** The session's worker, holding a copy of its model (started on first use). */
function modelJob(S) {
  if (!S.job) {
    S.job = new Job();
    S.job.call("model", { config: S.config, tensors: Array.from(S.tensors.entries()), vocab: S.vocab, toy: !!S.toy })
      .catch(() => {});
  }
  return S.job;
}

// ---------------------------------------------------------------- checks, as the CLI and the server give them
function limitCheck(S, what, value, name, field) {
  const bound = S.limits[name];
  if (bound !== undefined && value > bound) {
    throw new LiveError(`${what} is ${thousands(value)}; the limit is ${thousands(bound)} (${name})`, field);
  }
}

/** Units and ids of a source sentence; over-long input is one line naming the limit. */
function checkSource(S, text, field = "source") {
  if (typeof text !== "string") throw new LiveError(`${field}: expected a string of Chinese text`, field);
  limitCheck(S, `${field}: characters`, Array.from(text).length, "MAX_SOURCE_CHARS", field);
  const enc = S.source.analyse(text);
  limitCheck(S, `${field}: units`, enc.units.length, "MAX_SENTENCE_TOKENS", field);
  const missing = enc.ids.findIndex((id) => id === null);          // a toy without <unk>: its symbols only
  if (missing >= 0) {
    throw new LiveError(`${field}: '${enc.units[missing].slice(0, 40)}' is not a symbol of this toy (its symbols: `
      + `${S.source.symbols().join(" ")})`, field);
  }
  const limit = S.config.max_len;
  if (enc.ids.length > limit) {
    throw new LiveError(`${field}: ${enc.ids.length} units, over the model's limit of ${limit} source units (shorten it)`, field);
  }
  return enc;
}

function checkTarget(S, text, field = "target") {
  if (typeof text !== "string") throw new LiveError(`${field}: expected a string of English text`, field);
  limitCheck(S, `${field}: characters`, Array.from(text).length, "MAX_TARGET_CHARS", field);
  const ids = S.target.encode(text);
  limitCheck(S, `${field}: tokens`, ids.length, "MAX_SENTENCE_TOKENS", field);
  const missing = ids.findIndex((id) => id === null);
  if (missing >= 0) {
    throw new LiveError(`${field}: '${text.trim().split(/\s+/)[missing]}' is not a symbol of this toy (its symbols: `
      + `${S.target.symbols().join(" ")})`, field);
  }
  const named = { [S.config.bos_id]: "<s>", [S.config.eos_id]: "</s>", [S.config.pad_id]: "<pad>" };
  const special = ids.find((id) => id in named);                 // the tokenizer reads "</s>" as the token itself
  if (special !== undefined) {
    throw new LiveError(`${field}: '${named[special]}' is one of the vocabulary's special tokens (<s>, </s>, <pad>), `
      + "not English text; write the words (the end marker is added)", field);
  }
  if (ids.length + 1 > S.config.max_len) {
    throw new LiveError(`${field} has ${ids.length} tokens; the model takes at most ${S.config.max_len - 1}`, field);
  }
  return ids;
}

const HEAD_NAME = /^(encoder|decoder)\.(\d+)\.(self_attention|cross_attention)\.head\.(\d+)$/;

/** Heads switched off: probe names without ".output", each one this model has. */
function checkOff(S, off) {
  if (off === undefined || off === null) return [];
  if (!Array.isArray(off)) throw new LiveError("off: expected a list of head names like decoder.1.cross_attention.head.1", "off");
  const cfg = S.config;
  return off.map((name) => {
    const m = HEAD_NAME.exec(String(name));
    const layers = m && (m[1] === "encoder" ? cfg.encoder_layers : cfg.decoder_layers);
    if (!m || (m[1] === "encoder" && m[3] !== "self_attention") || +m[2] >= layers || +m[4] >= cfg.heads) {
      throw new LiveError(`off: ${String(name).slice(0, 80)} is not a head of this model (encoder.L.self_attention.head.H, `
        + `decoder.L.self_attention.head.H or decoder.L.cross_attention.head.H; ${cfg.encoder_layers}+${cfg.decoder_layers} `
        + `layers, ${cfg.heads} heads, counted from 0)`, "off");
    }
    return String(name);
  });
}

// ---------------------------------------------------------------- the script API
async function translate(S, text, opts) {
  const beam = opts && opts.beam !== undefined ? opts.beam : 1;
  if (!Number.isInteger(beam) || beam < 1) throw new LiveError(`beam: expected a whole number from 1, got ${beam}`, "beam");
  limitCheck(S, "beam", beam, "MAX_BEAM", "beam");
  const enc = checkSource(S, text);
  if (!enc.ids.length) return "";                    // a blank line gives a blank line, as translate
  await pause();
  const hyp = generate(S.model, enc.ids, { beam, lengthPenalty: 1.0 });
  return S.target.decode(hyp.tokens);
}

async function next(S, source, prefix, opts) {
  const enc = checkSource(S, source);
  if (!enc.ids.length) throw new LiveError("source: no units after splitting", "source");
  const ids = checkTarget(S, prefix === undefined || prefix === null ? "" : prefix, "targetPrefix");
  const off = checkOff(S, opts && opts.off);
  await pause();
  return nextDistribution(S.model, enc.ids, ids, { off, top: Math.max(20, Math.min(S.config.tgt_vocab, 10)) })
    .map(({ id, p }) => ({ token: S.target.piece(id, S.config), id, p }));
}

// ---------------------------------------------------------------- what the views compute (the JSON of the API)
const ATTENTION = ["encoder.*.self_attention.head.*.weights", "decoder.*.self_attention.head.*.weights",
  "decoder.*.cross_attention.head.*.weights"];

function rows(m) {                                    // a Matrix as nested arrays
  const out = [];
  for (let i = 0; i < m.rows; i++) out.push(Array.from(m.data.subarray(i * m.cols, (i + 1) * m.cols)));
  return out;
}

/** POST /api/sentence, in the page: attention tables and each target row's next tokens. */
async function sentence(S, body) {
  const text = body.source;
  if (typeof text !== "string" || !text.trim()) throw new LiveError("source must be a non-empty string of Chinese text", "source");
  const enc = checkSource(S, text);
  if (!enc.units.length) throw new LiveError("source has no units after splitting", "source");
  let targetIds = null;
  if (typeof body.target === "string" && body.target.trim()) targetIds = checkTarget(S, body.target);
  const model = body.positions === false ? S.noPositions() : S.model;
  const cfg = S.config;
  const top = body.top_k || 5;
  await pause();
  let output; let finished;
  if (targetIds === null) { const hyp = generate(model, enc.ids, { beam: 1 }); output = hyp.tokens; finished = hyp.finished; }
  else { output = targetIds; finished = true; }
  const inputs = [cfg.bos_id, ...output];
  if (!finished && inputs.length > cfg.max_len) inputs.pop();
  const { logits, probes } = model.forward(enc.ids, inputs, { record: ATTENTION });
  const last = [];
  const nextRows = logits.map((row, t) => {
    const p = softmaxRow(row);
    const label = t + 1 < inputs.length ? inputs[t + 1] : (finished ? cfg.eos_id : p.indexOf(Math.max(...p)));
    last.push(label);
    const order = Array.from(p.keys()).sort((a, b) => p[b] - p[a] || a - b).slice(0, Math.min(top, p.length));
    let rank = 1;
    for (const v of p) if (v > p[label]) rank++;
    return { input: S.target.piece(inputs[t], cfg), next: S.target.piece(label, cfg), next_id: label, next_prob: p[label],
      next_rank: rank, top: order.map((id) => ({ token: S.target.piece(id, cfg), id, prob: p[id] })) };
  });
  const stack = (side, part, layers) => Array.from({ length: layers }, (_, i) => Array.from({ length: cfg.heads },
    (_, h) => rows(probes.get(`${side}.${i}.${part}.head.${h}.weights`))));
  return {
    model: S.info, source: enc.units, source_ids: enc.ids, unknown: enc.unknown, positions: body.positions !== false,
    mode: targetIds !== null ? "teacher_forced" : "greedy",
    target: inputs.map((id) => S.target.piece(id, cfg)), target_ids: inputs, translation: S.target.decode(output), finished,
    layers: { encoder: cfg.encoder_layers, decoder: cfg.decoder_layers }, heads: cfg.heads,
    encoder_self_attention: stack("encoder", "self_attention", cfg.encoder_layers),
    decoder_self_attention: stack("decoder", "self_attention", cfg.decoder_layers),
    cross_attention: stack("decoder", "cross_attention", cfg.decoder_layers),
    next_tokens: nextRows, pad_id: cfg.pad_id,
  };
}

const STRIP = ".,!?;:\"'";
const stripWord = (w) => { let a = 0; let b = w.length; while (a < b && STRIP.includes(w[a])) a++; while (b > a && STRIP.includes(w[b - 1])) b--; return w.slice(a, b); };
const pyWords = (text) => text.split(/[\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+/).filter(Boolean);
const readable = (token) => (token || "?").split("▁").join("") || token || "?";

/** interpret/patching.py focus_row: the row whose next token is the first piece of `word` in `text`. */
function focusRow(S, text, word) {
  if (typeof text !== "string" || !text.trim()) throw new LiveError("target: expected a non-empty English sentence", "target");
  if (typeof word !== "string" || !word.trim() || word.trim().includes(" ")) throw new LiveError("predict: expected one English word", "predict");
  word = word.trim();
  const words = pyWords(text);
  const at = words.findIndex((w) => stripWord(w).toLowerCase() === word.toLowerCase());
  if (at < 0) throw new LiveError(`predict: '${word}' is not a word of the target '${text}'`, "predict");
  const ids = checkTarget(S, text);
  const before = at ? S.target.encode(words.slice(0, at).join(" ")) : [];
  if (before.some((id, i) => ids[i] !== id) || before.length >= ids.length) {
    throw new LiveError(`predict: the target's tokens do not split before '${word}'`, "predict");
  }
  const pieces = Math.max(1, S.target.encode([...words.slice(0, at), stripWord(words[at])].join(" ")).length - before.length);
  return { row: before.length, token: ids[before.length], ids, pieces, word };
}

function patchSource(S, text, field) {
  if (typeof text !== "string" || !text.trim()) throw new LiveError(`${field}: expected a non-empty Chinese sentence`, field);
  const enc = checkSource(S, text, field);
  if (enc.unknown.length) throw new LiveError(`${field}: unknown unit '${enc.unknown[0]}' (not in the model's source vocabulary)`, field);
  if (!enc.ids.length) throw new LiveError(`${field}: no units after splitting`, field);
  return enc;
}

/** POST /api/patch, in the page. Activation patching runs here in chunks, onProgress({done, total}); attribution
 * patching (method "attribution": one backward pass) in the worker. */
async function patch(S, body, onProgress) {
  const method = body.method === undefined ? "activation" : body.method;
  if (method !== "activation" && method !== "attribution") {
    throw new LiveError(`method: expected one of activation, attribution, got ${JSON.stringify(method)}`, "method");
  }
  const clean = patchSource(S, body.clean, "clean");
  const corrupts = Array.isArray(body.corrupt) ? body.corrupt : [body.corrupt];
  const focus = focusRow(S, body.target, body.predict);
  const cfg = S.config;
  const positions = body.positions !== false;
  const tgtIn = [cfg.bos_id, ...focus.ids];
  const runs = [];
  for (const [k, sentenceText] of corrupts.entries()) {
    const field = corrupts.length > 1 ? `corrupt[${k}]` : "corrupt";
    const enc = patchSource(S, sentenceText, field);
    if (positions && enc.ids.length !== clean.ids.length) {
      throw new LiveError(`${field}: ${enc.ids.length} units (${enc.units.join(" ")}) but the clean sentence has `
        + `${clean.ids.length}; patching positions needs the same count (or heads only)`, field);
    }
    if (method === "attribution") {                  // one backward pass, in the worker
      const table = await modelJob(S).call("patching", { cleanIds: clean.ids, corruptIds: enc.ids, tgtInIds: tgtIn,
        row: focus.row, token: focus.token, options: { positions } }, onProgress);
      runs.push({ corrupt: sentenceText, units: enc.units, ...table });
      continue;
    }
    const scan = patchingScan(S.model, clean.ids, enc.ids, tgtIn, focus.row, focus.token, { positions });
    let started = performance.now();
    for (;;) {
      const step = scan.next();
      if (step.done) { runs.push({ corrupt: sentenceText, units: enc.units, ...step.value }); break; }
      if (performance.now() - started > 40) {         // hand the tab back every ~40 ms
        if (onProgress) onProgress(step.value);
        await pause();
        started = performance.now();
      }
    }
  }
  const names = ["<s>", ...focus.ids.map((id) => readable(S.target.idToToken(id)))];
  const piece = readable(S.target.idToToken(focus.token));
  return {
    model: S.info, method, clean: body.clean, clean_units: clean.units, target: body.target, inputs: names,
    row: focus.row, row_sees: names.slice(0, focus.row + 1), predict: piece, token_id: focus.token,
    layers: { encoder: cfg.encoder_layers, decoder: cfg.decoder_layers }, heads: cfg.heads,
    note: focus.pieces > 1 ? `'${focus.word}' is ${focus.pieces} sub-word pieces here: p is that of its first piece '${piece}'`
      : `'${focus.word}' is one token here ('${piece}')`,
    runs,
  };
}

// ---------------------------------------------------------------- attribution (glassformer attribute, in the worker)
// engine/attribute.js computes the rows and checks steps, rule and tolerance as the CLI does; here: the options'
// names, the method, the contrast word's token and the sentence's rows (the greedy output when no target is given).
const CLI_DEFAULTS = { method: "integrated-gradients", steps: AUTO_STEPS, contrast: null, tolerance: 0.01, rule: "trapezoid" };
const LENS_INPUT = "gave";                           // the lens reads the row whose newest input is `gave`

/** The options of `glassformer attribute` with its defaults; the contrast word as one token of the target vocabulary. */
function attributionOptions(S, opts) {
  const given = Object.assign({}, opts || {});
  for (const key of Object.keys(given)) {
    if (!(key in CLI_DEFAULTS)) throw new LiveError(`${key}: not an option of attribute (${Object.keys(CLI_DEFAULTS).join(", ")})`, key);
    if (given[key] === undefined) delete given[key];
  }
  const o = Object.assign({}, CLI_DEFAULTS, given);
  if (!ATTRIBUTION_METHODS.includes(o.method)) {
    throw new LiveError(`method: expected one of ${ATTRIBUTION_METHODS.join(", ")}, got ${JSON.stringify(o.method)}`, "method");
  }
  o.contrastId = null;
  if (o.contrast !== null) {                          // interpret/why.py contrast_id
    if (typeof o.contrast !== "string" || !o.contrast.trim() || o.contrast.trim().split(/\s+/).length !== 1) {
      throw new LiveError("contrast: expected one English word", "contrast");
    }
    o.contrast = o.contrast.trim();
    const ids = S.target.encode(o.contrast);
    if (ids.length !== 1 || ids[0] === null || ids[0] === UNK_ID) {
      const shown = ids.map((id) => (id === null ? "?" : S.target.idToToken(id))).join(" ") || "nothing";
      throw new LiveError(`contrast: '${o.contrast}' is not one token of the target vocabulary (it is ${shown})`, "contrast");
    }
    o.contrastId = ids[0];
  }
  return o;
}

/** POST /api/attribute's answer, computed in the page: {model, method, contrast, integration, rows, details}.
 * body: {source, target (null: the greedy output), method, steps, contrast, tolerance, rule}; the rows are
 * `glassformer attribute --json`'s. onProgress({done, total}) after each forward-backward pass in the worker. */
async function attributeRun(S, body, onProgress) {
  const { source, target } = body;
  const opts = Object.assign({}, body);
  delete opts.source; delete opts.target;
  const o = attributionOptions(S, opts);
  const enc = patchSource(S, source, "source");      // as interpret/why.py: no unknown unit
  const forced = typeof target === "string" && target.trim();
  let rows;
  try {
    rows = attributionTarget(S.model, enc.ids, forced ? checkTarget(S, target) : null);
  } catch (e) { throw e instanceof LiveError ? e : new LiveError(e.message, e.field || "target"); }
  const pieces = targetPieces(S.model, (id) => S.target.idToToken(id), rows.targetIds);
  await pause();
  const report = await modelJob(S).call("attribute", {
    sentence: { srcIds: enc.ids, tgtInIds: rows.tgtInIds, targetIds: rows.targetIds, sourceUnits: enc.units,
      targetTokens: pieces, contrast: o.contrastId === null ? null : o.contrast, contrastToken: o.contrastId },
    options: { method: o.method, steps: o.steps, tolerance: o.tolerance, rule: o.rule },
  }, onProgress);
  const names = rows.tgtInIds.map((id) => readable(targetPieces(S.model, (i) => S.target.idToToken(i), [id])[0]));
  const n = rows.targetIds.length;
  // the lens row (interpret/why.py lens_row): the row after the word `gave`, else row 0
  let row = 0; let why = `no '${LENS_INPUT}' in the target: row 0`;
  const at = report.rows.findIndex((r, k) => r.token.toLowerCase() === LENS_INPUT
    && (k + 1 < report.rows.length ? report.rows[k + 1].position : n) < n);
  if (at >= 0) { row = at + 1 < report.rows.length ? report.rows[at + 1].position : n; why = `the row whose newest input is '${LENS_INPUT}'`; }
  const lens = logitLens(S.model, enc.ids, rows.tgtInIds, row, rows.targetIds[row], o.contrastId);
  const integrating = o.method === "integrated-gradients";
  return Object.assign({ model: S.info }, report, {
    details: { units: enc.units, unknown: enc.unknown, translation: S.target.decode(rows.outIds), mode: rows.mode,
      finished: rows.finished, inputs: names, pieces: pieces.map(readable), steps: integrating ? o.steps : null,
      baseline: integrating ? baselineName(S.model) : null,
      lens: Object.assign({}, lens, { row, token: readable(pieces[row]), contrast: report.contrast, why, sees: names.slice(0, row + 1) }) },
  });
}

/** window.glassformer.attribute: the JSON `glassformer attribute --json` prints for these arguments. */
async function attributeApi(S, source, target, opts) {
  if (opts !== undefined && opts !== null && (typeof opts !== "object" || Array.isArray(opts))) {
    throw new LiveError("options: expected an object like {method, steps, contrast}", "options");
  }
  if (target !== null && target !== undefined && typeof target !== "string") {
    throw new LiveError("target: expected a string of English text, or null for the greedy translation", "target");
  }
  const r = await attributeRun(S, Object.assign({}, opts || {}, { source, target: target === undefined ? null : target }));
  return { method: r.method, contrast: r.contrast, integration: r.integration, rows: r.rows };
}

// ---------------------------------------------------------------- training (engine/train.js, in a worker)
/** The complete options of a training run, or a LiveError naming the field (checkTrainOptions' line). */
function trainOptions(opts) {
  if (opts !== undefined && opts !== null && (typeof opts !== "object" || Array.isArray(opts))) {
    throw new LiveError("options: expected an object like {task, seed, seconds}", "options");
  }
  try { return checkTrainOptions(Object.assign({}, opts || {})); } catch (e) {
    throw new LiveError(String(e.message).split("\n")[0], e.field || "options");
  }
}

/** window.glassformer.train: a fresh worker trains the toy; {steps, seconds, loss, accuracy, example}. */
async function train(opts, onProgress) {
  const options = trainOptions(opts);
  const job = new Job();
  try { return await job.call("train", { options }, onProgress); } finally { job.close(); }
}

/** The Train view's trainer in a worker of its own: start(options) -> snapshot, run, pause, step, weights. */
function trainer() {
  const job = new Job();
  return {
    start: (opts) => job.call("trainer.new", { options: trainOptions(opts) }),
    run: () => job.call("trainer.run", {}),
    pause: () => job.call("trainer.pause", {}),
    step: () => job.call("trainer.step", {}),
    weights: () => job.call("trainer.weights", {}),
    onUpdate: (listener) => { job.listeners["trainer.update"] = listener; },
    close: () => job.close(),
  };
}

// ---------------------------------------------------------------- wiring
const ready = start();
ready.catch(() => {});                                // reported on the page below, and to whoever awaits it
let toy = null;                                       // a toy opened in the views (useToy), else null

/** The session the views and the script API use: the toy while one is open, else the translator. */
async function current() {
  return toy || ready;                                // a toy runs even where the translator does not load here
}

function withSession(fn) {
  return async (...args) => fn(await current(), ...args);
}

/** Open a toy trained in the Train view in every view (weights: the trainer's; meta: {task, accuracy, example, label}). */
async function useToy(weights, meta) {
  let limits = {};
  try { limits = (await ready).limits; } catch (e) { /* the toy does not need the translator */ }
  const session = toySession(weights, meta, limits);
  if (toy && toy.job) toy.job.close();
  toy = session;
  window.dispatchEvent(new CustomEvent("lab-model", { detail: session.viewInfo }));
  return session.viewInfo;
}

function useTranslator() {
  if (toy && toy.job) toy.job.close();
  toy = null;
  window.dispatchEvent(new CustomEvent("lab-model", { detail: null }));
}

window.glassformer = {
  ready: ready.then(() => true),
  translate: withSession(translate),
  next: withSession(next),
  analyse: withSession(async (S, text) => { const e = checkSource(S, text); return { units: e.units, ids: e.ids, unknown: e.unknown }; }),
  attribute: withSession(attributeApi),
  train: async (opts) => train(opts),
};
window.glassformer.ready.catch(() => {});

window.LAB_LIVE = {
  ready,
  current,
  LiveError,
  sentence: withSession(sentence),
  patch: withSession(patch),
  attribute: withSession(attributeRun),
  trace: async (doc) => runTrace(doc),
  checkSource: withSession(async (S, text, field) => checkSource(S, text, field)),
  // the Train view: a trainer in its own worker, the engine's tasks and defaults, opening a toy in the views
  training: { trainer, defaults: TRAIN_DEFAULTS, tasks: TASKS, check: trainOptions, train },
  useToy,
  useTranslator,
  // the Exercise view: sheets, keys and checks in the page (no model needed, so not behind `ready`)
  exercises: { newSheet: newExerciseSheet, key: exerciseKey, runWith: runExerciseWithBug, check: checkExercise,
    parseTable: parseExerciseTable, bug: exerciseBug, notCovered: exerciseNotCovered },
};

ready.then(() => { document.body.dataset.liveReady = "1"; }, (err) => {
  document.body.dataset.liveReady = "error";
  const box = document.getElementById("error");
  if (box && (EMBED || err.field === "file")) { box.textContent = err.message; box.hidden = false; }
});
