// The lesson's Transformer in the page: plain ES modules, float64, no dependency, no build step.
//
// CONTRACT (what the page, its script API and the tests code against; shapes as (rows, columns)):
//
// A Matrix is a plain object {rows, cols, data: Float64Array(rows * cols)}, row-major: entry (i, j) is
// data[i * cols + j]. Every probe value is a Matrix of one sentence (the batch axis of docs/probes.md dropped).
//
// weights.js
//   loadBundle(bundle) -> {config, vocab, tensors}
//     bundle: the parsed JSON of lab/bundle.py's write_bundle ({"format": "glassformer-bundle/1", "config",
//     "vocab", "dtype": "float32"|"float16", "tensors": {name: {shape, offset, length}}, "data": base64});
//     config: the ModelConfig dict (config.json's "model"); vocab: vocab.json ({source, target});
//     tensors: Map name -> {shape: number[], data: Float64Array}, names as the PyTorch state_dict
//     (nn.Linear weights (out, in)); a tied matrix is stored once (the model resolves it from the config).
//     A damaged bundle throws an Error with one line: "model bundle: ...".
//
// model.js
//   new Transformer(config, tensors)
//     .config, .probeNames()                        every probe name this model has (docs/probes.md)
//     .forward(srcIds, tgtInIds, opts) -> {logits, probes}
//        srcIds (S,) source ids; tgtInIds (T,) right-shifted target ids, BOS first
//        logits: Array of T Float64Array rows, each (V,)   vocabulary scores of every target row
//        probes: Map probe name -> Matrix (the last firing), only what opts.record asked for
//     opts (every call that runs the model takes them):
//        record: true (every probe) | ["decoder.*.cross_attention.head.*.weights", "logits", ...]  (fnmatch:
//                `*` spans dots). A probe is recorded BEFORE an intervention replaces it (a switched-off
//                head still shows its own output; its concat columns are zeros).
//        intervene: {probeNameOrPattern: fn(value: Matrix, name) -> Matrix of the same shape}
//        off: ["decoder.1.cross_attention.head.1", ...]   heads switched off (their output replaced by zeros)
//     .encode(srcIds, opts) -> encoded = {memory: Matrix (S, d) H, flags: PAD flags (S,), padding: flags or null
//        when no PAD, probes}
//     .decode(tgtInIds, encoded, opts) -> {logits, probes}     the decoder alone over one encoding
//     .newCache() -> a KV cache for one sentence (max_len target positions)
//     .decodeStep(tokenId, encoded, cache, opts) -> {logits: Float64Array (V,), probes}
//        one incremental decoding step: the newest target token at position cache.length (the same numbers
//        as forward's row at that position); probes fire with a query length of 1
//     .logitsOf(hidden: Matrix (rows, d)) -> Matrix (rows, V)     the vocabulary head
//
//   Reverse mode (float64; each op's backward is written beside its forward, its formula in a comment):
//   gradients(model, srcIds, tgtInIds, seed, opts) -> {params: Map name -> Float64Array (the tensor's layout,
//        state_dict names as the bundle stores them: a tied matrix once, holding both its gradients),
//        srcEmbedding: Matrix (S, d), tgtEmbedding: Matrix (T, d)   (dL/d the values at encoder.embedding /
//        decoder.embedding), value}
//     seed: {labels (T,), smoothing = 0, scale = 1}   the loss of transformer.py's loss_sum (label-smoothed
//              cross-entropy summed over the rows whose label is not PAD), times scale
//         | {row, token, contrast = null}             f = log p(token) - log p(contrast) at target row `row`
//         | (logits: Matrix (T, V)) => {value, grad: Matrix (T, V)}
//     opts: off (as forward), weights (false: the inputs' gradients only, faster), embeddings {src, tgt}:
//        Matrices run in place of the values at the two embedding hook points (integrated gradients' path)
//   tapedPass(model, srcIds, tgtInIds, opts) -> Pass {logits: Matrix (T, V), srcEmbedding, tgtEmbedding,
//        backward(dLogits) (again for another objective over the same forward), gradAt(probe name) -> Matrix,
//        weightGradients() -> Map}; opts as gradients' plus keep: [probe names whose gradients are read]
//   labelSmoothedLoss(logits, labels, smoothing, padId, scale) -> {value, count, grad}
//   logProbObjective(logits, row, token, contrast) -> {value, grad}
//
// search.js  (the rules of `glassformer translate`: decoding/search.py, stop rule "bound", alpha 1.0)
//   greedy(model, srcIds, {maxLen}) -> number[]                   target ids without BOS/EOS
//   beamSearch(model, srcIds, {beam: 4, lengthPenalty: 1.0, maxLen}) -> number[]
//   generate(model, srcIds, {beam, lengthPenalty, maxLen, off}) -> {tokens, score, normalized, finished}
//   outputLimit(sourceLength, modelMaxLen, maxLen) -> most tokens generated (EOS included): 2 S + 10, capped
//   greedy / beamSearch / generate also take {off: [...]}: decoding with heads switched off
//
// interpret.js
//   nextDistribution(model, srcIds, prefixIds, {off, top}) -> [{id, p}, ...] most probable first
//        p(next | BOS + prefix); top entries (default 20; Infinity for the whole vocabulary)
//   patchingTable(model, cleanIds, corruptIds, tgtInIds, row, token, {positions: true, onProgress})
//        -> the JSON of interpret/patching.py patch_scan: {p_clean, p_corrupt, heads[layer][head]: {p, fraction},
//           all_heads, nothing, position_layers, positions[layer][pos] | null, all_positions}
//   patchingScan(...same arguments)  a generator: yields {done, total} after each run, returns the table
//        (the page runs it in chunks and shows progress)
//   logitLens(model, srcIds, tgtInIds, row, token, contrast) -> the JSON of interpret/lens.py logit_lens:
//        {reading, row, steps: [{layer, sublayer, name, p, p_contrast}], p_model, p_contrast_model}
//   altiPlus(model, srcIds, tgtInIds) -> Matrix (T, S + T): ALTI+ shares of interpret/alti.py, rows sum to 1
//
// attribute.js  (glassformer attribute --json, interpret/why.py, attribution.py, integrated.py, attribution_patching.py)
//   attributionTarget(model, srcIds, outIds | null, {off}) -> {tgtInIds, targetIds, mode, finished, outIds}
//        the rows of `glassformer attribute`: teacher-forced outIds (target ids without BOS/EOS; EOS is the last
//        row's label), or null: the greedy output fed back (unfinished: no EOS row)
//   targetPieces(model, idToToken, ids) -> the piece of each id as the CLI names it ("▁gave", "</s>", "<s>")
//   attributeReportScan(model, sentence, opts)  a generator: yields {done, total} after each forward-backward pass
//        and returns the object `glassformer attribute --json` prints: {method, contrast, integration, rows}
//        (rows by word: position, token, source [[unit, score]], prefix [[word, score]], sum, delta, error,
//        steps, passes, source_share — the same names, order and numbers as the CLI's)
//        sentence: {srcIds, tgtInIds, targetIds, sourceUnits, targetTokens (targetPieces), contrast (the word
//          or null), contrastToken (its id), decode (ids -> text: the target tokenizer's, for the word names)}
//        opts: {method: "integrated-gradients" (default) | "input-x-gradient" | "saliency" | "attention" |
//          "alti", steps: "auto" (default) | 1..256, rule: "trapezoid" | "gauss-legendre", tolerance: 0.01, off}
//   attributeReport(model, sentence, {..., onProgress})    the same, run to its end
//   attributionRows(model, srcIds, tgtInIds, rows, tokens, opts)  a generator over piece rows: returns
//        {method, source: Float64Array (S,)[], prefix: Float64Array (T,)[], value, baseline, error, steps,
//        passes}; opts.contrast: an id for every row or one per row (< 0: none); opts.group: auto's words
//   attribution(...same)   run to its end
//   attributionPatchingScan(model, cleanIds, corruptIds, tgtInIds, row, token, {positions})  a generator (three
//        passes) returning patchingTable's fields, each cell estimated from one backward pass (POST /api/patch,
//        method "attribution"); attributionPatching(...) runs it to its end
//   A bad option throws an Error whose .field names it (steps, rule, tolerance, method, contrast, row).
//
// train.js  (pure computation: no timer, no DOM; a worker and Node run it alike)
//   TASKS {copy, reverse, sort, grammar}: one line each; TRAIN_DEFAULTS: every option with its default;
//   TRAIN_LIMITS: the named limits (MAX_TOY_D_MODEL 128, MAX_TOY_LAYERS 4, MAX_TOY_BATCH 64, MAX_TOY_LENGTH 24, ...)
//   checkTrainOptions(opts) -> the options completed, or throws Error (one line, .field) naming the field and limit
//   new Trainer(opts): the toy vocabularies, held-out and validation sequences (drawn first, never trained on),
//        weights from the seed (the same seed: the same run, step for step)
//     .model (an engine Transformer over the live weights), .config (ModelConfig dict), .vocab {source, target}
//        (index = id, specials first), .tensors Map state_dict name -> {shape, data} (a tied head stored once),
//        .options, .heldOut / .validationSet ([source words, target words] pairs)
//     .step() -> {step, loss, batch: {source, targetIn, targetOut, predicted}} (words; predicted: the argmax at
//        every position of the one teacher-forced pass)
//     .losses, .stepCount, .learningRate(t)
//     .evaluate(limit) -> exact-match rate of greedy outputs on the held-out sequences
//     .solvedShare(pairs) -> the same rate from one teacher-forced pass a sequence (a sequence whose every argmax
//        is right is what greedy writes); .validate() on the validation set
//     .example(i = .shown) -> {source, target, greedy, teacherForced, cross_attention (target row x source position,
//        the last decoder layer, mean over heads)}; .shown: the first held-out pair of the greatest length
//   trainUntilDone(trainer, {now, onProgress, shouldStop}) / runTraining(opts, clock) -> {steps, seconds, loss,
//        accuracy, validation, example: {source, target, cross_attention}}  (window.glassformer.train's answer)
//   trainStep, batchGradients, Adam, learningRate, clipGradients, initialWeights, seededRandom: the pieces
//
// trace.js  (trace spec v1, as lesson/spec.py and lesson/reference.py: nested arrays in, the same JSON out)
//   runTrace(doc) -> {version: 1, kind, ...}   masked scaled scores are null; throws Error("field: ...")
//   blockSpec(norm = "post"), exerciseSpec(scale = false)     the lesson's BLOCK and 2x3 exercise documents
//   round6(json) -> the same JSON, numbers to the lesson's six decimals
//   primitives on number[][] (rows of numbers): matmul(a, b), transpose(a), softmaxRows(scores, visible),
//   layerNorm(x, gamma, beta, eps), attention(q, k, v, {visible, scale}) -> {scores, scaled_scores, weights, output}
//
// Tokens are ids everywhere here; text <-> ids is tokenize.js.

export { loadBundle } from "./weights.js";
export { Transformer, matrix, causalMask, KVCache, Tape, tapedPass, gradients, labelSmoothedLoss, logProbObjective } from "./model.js";
export { greedy, beamSearch, generate, outputLimit } from "./search.js";
export { nextDistribution, patchingTable, patchingScan, logitLens, altiPlus, softmaxRow } from "./interpret.js";
export { attributeReport, attributeReportScan, attribution, attributionRows, attributionTarget, attributionPatching,
  attributionPatchingScan, targetPieces, wordGroups, baselineName, gaussLegendre, ATTRIBUTION_METHODS, GRADIENT_METHODS, AUTO_STEPS,
  ATTRIBUTION_LIMITS } from "./attribute.js";
export { TASKS, TRAIN_DEFAULTS, TRAIN_LIMITS, checkTrainOptions, Trainer, runTraining, trainUntilDone, trainStep,
  batchGradients, Adam, learningRate, clipGradients, initialWeights, seededRandom } from "./train.js";
export { loadTokenizers } from "./tokenize.js";
export { runTrace, blockSpec, exerciseSpec, round6, matmul, transpose, softmaxRows, layerNorm, attention } from "./trace.js";
