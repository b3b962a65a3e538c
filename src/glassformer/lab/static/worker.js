// glassformer lab: the page's Web Worker. The long work runs here, off the page's thread, so the tab stays
// responsive: gradient attribution (engine/attribute.js) and attribution patching over the model the views use,
// and training a toy encoder–decoder (engine/train.js). The worker holds its own copy of the model, built from
// the same weights as the page's (live.js sends the config and the tensors).
//
// Served, it is a module worker (worker.js and engine/ from the server); in the exported file live.js starts it
// from the inlined text of this file and the engine (a Blob URL: no request leaves the file).
//
// Messages in:  {id, op, ...}      ops: model, attribute, patching, train, trainer.new, trainer.run,
//                                    trainer.pause, trainer.step, trainer.weights
// Messages out: {id, progress}     {done, total} while a call runs
//               {id, value}        the call's answer
//               {id, error: {message, field}}
//               {op: "trainer.update", update}   the Train view's trainer as it runs (no id: not an answer)
import { Transformer, attributeReportScan, attributionPatchingScan, loadTokenizers, Trainer, runTraining } from "./engine/index.js";
import { ToyTokenizer } from "./toy.js";

let model = null;                  // the model the views use (the translator, or a toy opened in the views)
let decode = null;                 // its target tokenizer's decode (a word of the attribution rows, as the CLI's)
let trainer = null;                // the Train view's trainer
let running = false;               // the trainer steps on its own until paused
let lastEvaluation = 0;            // when the running trainer last measured its held-out accuracy (ms)
let evaluationCost = 0;            // ... and how long that took (ms)

const CHUNK_MS = 80;               // a running trainer reports after about this long
const EVALUATE_MS = 1000;          // ... and measures held-out accuracy and redraws its example at most this often,
const EVALUATE_SHARE = 0.2;        // spending at most this share of its time on it
const now = () => performance.now();

const reply = (id, message) => self.postMessage(Object.assign({ id }, message));

function asError(err) {
  return { message: String((err && err.message) || err).split("\n")[0], field: (err && err.field) || null };
}

// generators (the engine's scans) run to their end, each pass reported
function drain(id, scan) {
  for (;;) {
    const step = scan.next();
    if (step.done) return step.value;
    reply(id, { progress: step.value });
  }
}

function tensorsOf(entries) {
  return new Map(entries.map(([name, t]) => [name, { shape: t.shape, data: t.data }]));
}

// ---------------------------------------------------------------- the Train view's trainer
function snapshot(stepped, evaluate) {
  const update = { step: trainer.stepCount, task: trainer.options.task };
  if (stepped) Object.assign(update, stepped);
  if (evaluate) {
    const start = now();
    update.accuracy = heldOutAccuracy();
    update.example = trainer.example();
    lastEvaluation = now();
    evaluationCost = lastEvaluation - start;
  }
  return update;
}

// The exact-match rate of greedy outputs on the held-out sequences. A sequence whose every teacher-forced argmax
// is right is exactly what greedy decoding writes (it sees the same right prefix at each step), so the trainer's
// teacher-forced count gives the same number at one forward pass a sequence.
function heldOutAccuracy() {
  return trainer.solvedShare(trainer.heldOut);
}

const evaluationDue = () => now() - lastEvaluation > Math.max(EVALUATE_MS, evaluationCost / EVALUATE_SHARE);

function runChunk() {
  if (!running || !trainer) return;
  const start = now();
  const losses = [];
  let last = null;
  try {
    while (now() - start < CHUNK_MS) {
      last = trainer.step();
      losses.push(last.loss);
    }
    const update = snapshot({ losses, batch: last.batch }, evaluationDue());
    if (update.accuracy !== undefined && update.accuracy >= 1) { running = false; update.finished = true; }
    update.running = running;
    self.postMessage({ op: "trainer.update", update });
  } catch (err) {
    running = false;
    self.postMessage({ op: "trainer.update", update: { running: false, error: asError(err) } });
    return;
  }
  setTimeout(runChunk, 0);             // let the next message in (pause, step, weights)
}

function weights() {
  const tensors = [];
  for (const [name, t] of trainer.tensors) tensors.push([name, { shape: t.shape.slice(), data: Float64Array.from(t.data) }]);
  return { config: trainer.config, vocab: trainer.vocab, tensors, step: trainer.stepCount };
}

// ---------------------------------------------------------------- the calls
const OPS = {
  model(m) {
    model = new Transformer(m.config, tensorsOf(m.tensors));
    const target = m.toy ? new ToyTokenizer(m.vocab.target, m.config, "target") : loadTokenizers(m.vocab).target;
    decode = (ids) => target.decode(ids);
    return true;
  },
  attribute(m) {
    if (!model) throw new Error("worker: no model loaded");
    return drain(m.id, attributeReportScan(model, Object.assign({ decode }, m.sentence), m.options));
  },
  patching(m) {
    if (!model) throw new Error("worker: no model loaded");
    return drain(m.id, attributionPatchingScan(model, m.cleanIds, m.corruptIds, m.tgtInIds, m.row, m.token, m.options));
  },
  train(m) {
    return runTraining(m.options, {
      now,
      onProgress: (progress) => reply(m.id, { progress }),
    });
  },
  "trainer.new"(m) {
    running = false;
    trainer = new Trainer(m.options);
    return snapshot(null, true);
  },
  "trainer.run"() {
    if (!trainer) throw new Error("worker: no trainer");
    if (!running) { running = true; setTimeout(runChunk, 0); }
    return true;
  },
  "trainer.pause"() {
    running = false;
    return trainer ? snapshot(null, true) : null;
  },
  "trainer.step"() {
    if (!trainer) throw new Error("worker: no trainer");
    running = false;
    const last = trainer.step();
    return snapshot({ losses: [last.loss], batch: last.batch }, true);
  },
  "trainer.weights"() {
    if (!trainer) throw new Error("worker: no trainer");
    return weights();
  },
};

self.onmessage = (event) => {
  const m = event.data;
  try {
    if (!Object.prototype.hasOwnProperty.call(OPS, m.op)) throw new Error(`worker: unknown op ${m.op}`);
    reply(m.id, { value: OPS[m.op](m) });
  } catch (err) {
    reply(m.id, { error: asError(err) });
  }
};
