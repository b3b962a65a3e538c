// glassformer lab: the trained translator in the page. Loads the model bundle (embedded in the exported file,
// GET api/bundle when served), builds the engine (engine/) and its tokenizers, and offers
//   window.glassformer = {ready, translate(text, {beam}), next(source, targetPrefix, {off}), analyse(text)}
// for scripts, and window.LAB_LIVE (the same session plus what the views compute) for the lab's views.
// Everything runs in float64 on the page's own thread; long work (patching) yields between runs.
import { loadBundle, Transformer, generate, nextDistribution, patchingScan, logitLens, altiPlus, runTrace, softmaxRow } from "./engine/index.js";
import { loadTokenizers } from "./engine/tokenize.js";
import { newExerciseSheet, exerciseKey, runExerciseWithBug, checkExercise, parseExerciseTable, exerciseBug, exerciseNotCovered } from "./engine/exercises.js";

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
    try { return JSON.parse(text); } catch (e) { throw new LiveError(`this file is damaged: its model is not valid JSON (${e.message})`, "file"); }
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
  return { config, model, noPositions, source, target, limits: payload.limits || {}, info: payload.model || null };
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

/** POST /api/patch (activation patching), in the page: the scan runs in chunks, onProgress({done, total}). */
async function patch(S, body, onProgress) {
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
    model: S.info, method: "activation", clean: body.clean, clean_units: clean.units, target: body.target, inputs: names,
    row: focus.row, row_sees: names.slice(0, focus.row + 1), predict: piece, token_id: focus.token,
    layers: { encoder: cfg.encoder_layers, decoder: cfg.decoder_layers }, heads: cfg.heads,
    note: focus.pieces > 1 ? `'${focus.word}' is ${focus.pieces} sub-word pieces here: p is that of its first piece '${piece}'`
      : `'${focus.word}' is one token here ('${piece}')`,
    runs,
  };
}

/** ALTI+ and the logit lens of a sentence and target (what the "why" view computes without gradients), in the
 * shape of POST /api/attribute with method "alti" (rows by target token). */
async function explainLive(S, body) {
  if (typeof body.source !== "string" || !body.source.trim()) throw new LiveError("source: expected a non-empty Chinese sentence", "source");
  const enc = checkSource(S, body.source);
  if (!enc.ids.length) throw new LiveError("source: no units after splitting", "source");
  const cfg = S.config;
  const forced = typeof body.target === "string" && body.target.trim();
  await pause();
  const hyp = forced ? null : generate(S.model, enc.ids, { beam: 1 });
  const ids = forced ? checkTarget(S, body.target) : hyp.tokens;
  const tgtIn = [cfg.bos_id, ...ids];
  const names = tgtIn.map((id) => S.target.piece(id, cfg));
  const labelOf = (t) => (t + 1 < tgtIn.length ? tgtIn[t + 1] : cfg.eos_id);
  let row = names.findIndex((n, t) => t > 0 && n.toLowerCase() === "gave");      // interpret/why.py lens_row
  const why = row >= 0 ? "the row whose newest input is 'gave'" : "no 'gave' in the target: row 0";
  if (row < 0) row = 0;
  const contrastWord = body.contrast && String(body.contrast).trim() ? String(body.contrast).trim() : null;
  let contrastId = null;
  if (contrastWord) {
    const pieces = S.target.encode(contrastWord);
    if (pieces.length !== 1 || pieces[0] === 3) throw new LiveError(`contrast: '${contrastWord}' is not one token of the target vocabulary`, "contrast");
    contrastId = pieces[0];
  }
  const lens = logitLens(S.model, enc.ids, tgtIn, row, labelOf(row), contrastId);
  await pause();
  const alti = altiPlus(S.model, enc.ids, tgtIn);
  const n = enc.ids.length;
  const rowsOut = tgtIn.map((_, t) => {
    const r = Array.from(alti.data.subarray(t * alti.cols, (t + 1) * alti.cols));
    const share = r.slice(0, n).reduce((a, b) => a + b, 0);
    return { position: t, token: S.target.piece(labelOf(t), cfg), source: enc.units.map((u, j) => [u, r[j]]),
      prefix: names.slice(0, t + 1).map((p, k) => [p, r[n + k]]), sum: r.reduce((a, b) => a + b, 0), delta: null,
      error: null, steps: null, passes: null, source_share: share };
  });
  return {
    model: S.info, method: "alti", contrast: null, integration: null, rows: rowsOut,
    details: { units: enc.units, unknown: enc.unknown, translation: S.target.decode(ids), mode: forced ? "teacher-forced" : "greedy",
      finished: forced ? true : hyp.finished, inputs: names, steps: null, baseline: null,
      lens: Object.assign({}, lens, { row, token: S.target.piece(labelOf(row), cfg), contrast: contrastWord, why,
        sees: names.slice(0, row + 1) }) },
  };
}

// ---------------------------------------------------------------- wiring
const ready = start();
ready.catch(() => {});                                // reported on the page below, and to whoever awaits it

function withSession(fn) {
  return async (...args) => fn(await ready, ...args);
}

window.glassformer = {
  ready: ready.then(() => true),
  translate: withSession(translate),
  next: withSession(next),
  analyse: withSession(async (S, text) => { const e = checkSource(S, text); return { units: e.units, ids: e.ids, unknown: e.unknown }; }),
};
window.glassformer.ready.catch(() => {});

window.LAB_LIVE = {
  ready,
  LiveError,
  sentence: withSession(sentence),
  patch: withSession(patch),
  explain: withSession(explainLive),
  trace: async (doc) => runTrace(doc),
  checkSource: withSession(async (S, text, field) => checkSource(S, text, field)),
  // the Exercise view: sheets, keys and checks in the page (no model needed, so not behind `ready`)
  exercises: { newSheet: newExerciseSheet, key: exerciseKey, runWith: runExerciseWithBug, check: checkExercise,
    parseTable: parseExerciseTable, bug: exerciseBug, notCovered: exerciseNotCovered },
};

ready.then(() => { document.body.dataset.liveReady = "1"; }, (err) => {
  document.body.dataset.liveReady = "error";
  const box = document.getElementById("error");
  if (box && (EMBED || err.field === "file")) { box.textContent = err.message; box.hidden = false; }
});
