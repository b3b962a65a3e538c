"""Chapter D, the whole translator: two stacks, cross-attention, right shift, scopes, the head, caching, size."""

from __future__ import annotations

import math

import numpy as np
import torch

from ...model.attention import MultiHeadAttention
from ...model.config import ModelConfig
from ...model.layers import DecoderLayer
from ...model.transformer import Transformer
from .. import examples as ex
from ..views import lesson_batch, next_token_walk
from .common import EXACT, diff, probes, seeded_model, source_ids, target_ids
from .registry import Reading, check, reading


@check("D1", "two stacks: encoder 2 sub-layers, decoder 3 with cross-attention that is used")
def two_stacks() -> Reading:
    model = seeded_model(5)
    enc = [len(layer.sublayer) for layer in model.encoder.layers]
    dec = [len(layer.sublayer) for layer in model.decoder.layers]
    cross = all(isinstance(layer.cross_attention, MultiHeadAttention) for layer in model.decoder.layers)
    no_cross_enc = all(not hasattr(layer, "cross_attention") for layer in model.encoder.layers)
    norms = [id(s.layer_norm) for stack in (model.encoder.layers, model.decoder.layers) for layer in stack
             for s in layer.sublayer]
    tgt = target_ids(ex.TARGET_INPUT)
    with torch.no_grad():
        a = model(source_ids(ex.NINE_UNITS), tgt)
        b = model(source_ids(["他" if u == "我" else "我" if u == "他" else u for u in ex.NINE_UNITS]), tgt)
    used = diff(a, b)
    bare = DecoderLayer(model.cfg, cross=False)
    return reading("encoder sub-layers {encoder}, decoder {decoder}; cross-attention in every decoder layer: "
                   "{cross}; {norms} separate norms; changing the source moves the logits by {used:.3f}",
                   enc == [2] * len(enc) and dec == [3] * len(dec) and cross and no_cross_enc
                   and len(set(norms)) == len(norms) and used > 1e-3 and len(bare.sublayer) == 2
                   and bare.cross_attention is None, tolerance={"moves": 1e-3},
                   encoder=enc, decoder=dec, cross=cross, norms=len(set(norms)), used=used)


@check("D2", "cross-attention: Q from the decoder, K/V from the final H; every valid source, no PAD")
def cross_attention_wiring() -> Reading:
    model = seeded_model(6)
    batch = lesson_batch()
    src, tgt, src_pad = batch.src, batch.tgt_in, batch.source_padding
    with torch.no_grad(), model.probes("decoder.*.cross_attention.head.*.weights",
                                       "decoder.*.cross_attention.head.*.k", "decoder.*.cross_attention.head.*.q",
                                       "decoder.*.sublayer.1.input", "encoder.output") as trace:
        model(src, tgt)
    valid_min, pad_max = math.inf, 0.0
    for w in probes(trace, "decoder.*.cross_attention.head.*.weights"):   # (batch, tgt, src)
        valid_min = min(valid_min, float(w.masked_select(~src_pad[:, None, :]).min()))
        pad_max = max(pad_max, float(w.masked_select(src_pad[:, None, :]).abs().max()))
    memory = trace["encoder.output"]
    kv_err = 0.0
    for i, layer in enumerate(model.decoder.layers):
        mha = layer.cross_attention
        with torch.no_grad():
            k_want = mha.project_kv(memory)[0]
            q_want = mha.project_q(trace[f"decoder.{i}.sublayer.1.input"])
        for h in range(mha.heads):
            kv_err = max(kv_err, diff(trace[f"decoder.{i}.cross_attention.head.{h}.k"], k_want[:, h]),
                         diff(trace[f"decoder.{i}.cross_attention.head.{h}.q"], q_want[:, h]))
    return reading("min weight on a valid source key {valid_min:.4f} (every target row, no triangle); "
                   "max on source PAD {pad_max:Δ}; K from H, Q from the decoder |Δ| = {projections:Δ}",
                   valid_min > 0 and pad_max == 0 and kv_err <= EXACT, tolerance={"exact": EXACT},
                   valid_min=valid_min, pad_max=pad_max, projections=kv_err)


@check("D3", "right shift: the `gave` row sees BOS, I, gave only")
def right_shift() -> Reading:
    model = seeded_model(7)
    src, tgt = source_ids(ex.NINE_UNITS), target_ids(ex.TARGET_INPUT)
    shifted = list(ex.TARGET_INPUT) == [ex.BOS, *ex.TARGET_LABELS[:-1]] and ex.TARGET_LABELS[ex.GAVE_ROW] == "him"
    g = ex.GAVE_ROW
    with torch.no_grad(), model.probes("decoder.*.self_attention.head.*.weights") as trace:
        base = model(src, tgt)[0, g]
    seen = set()
    for w in trace.records.values():
        seen |= set(torch.nonzero(w[0, g] > 0).flatten().tolist())
    other = ex.TARGET_VOCAB["book"]
    future, past = 0.0, math.inf
    for pos in range(len(ex.TARGET_INPUT)):
        t2 = tgt.clone()
        t2[0, pos] = other if int(t2[0, pos]) != other else ex.TARGET_VOCAB["a"]
        with torch.no_grad():
            moved = diff(model(src, t2)[0, g], base)
        if pos > g:
            future = max(future, moved)
        else:
            past = min(past, moved)
    return reading("keys seen by the gave row: {seen}; changing him… moves its logits {future:Δ}, "
                   "changing BOS/I/gave ≥ {past:.3f}", shifted and seen == set(range(g + 1)) and future == 0
                   and past > 1e-4, tolerance={"moves": 1e-4}, seen=sorted(seen), future=future, past=past)


@check("D4", "three scopes: source sees source, target sees its prefix, target sees the whole source")
def three_scopes() -> Reading:
    model = seeded_model(8)
    src, tgt = source_ids(ex.NINE_UNITS), target_ids(ex.TARGET_INPUT)
    with torch.no_grad(), model.probes("*coder.*.*_attention.head.*.weights") as trace:
        model(src, tgt)
    n, m = src.size(1), tgt.size(1)
    want = {"encoder.*.self_attention": np.ones((n, n), bool),
            "decoder.*.self_attention": np.tril(np.ones((m, m), bool)),
            "decoder.*.cross_attention": np.ones((m, n), bool)}
    ok, visible = True, {}
    for scope, table in want.items():
        tables = probes(trace, f"{scope}.head.*.weights")
        ok &= bool(tables) and all(np.array_equal(w[0].numpy() > 0, table) for w in tables)
        visible[scope.replace(".*.", " ")] = [int(table.sum()), int(table.size)]
    return reading("visible pairs: " + ", ".join(f"{scope} {{visible[{scope}][0]}}/{{visible[{scope}][1]}}"
                                                 for scope in visible) + " (all {tables} head tables agree)",
                   ok, visible=visible, tables=len(trace.records))


def greedy_with_cache(model: Transformer, src: torch.Tensor, bos: int, eos: int,
                      max_steps: int) -> tuple[list[int], list]:
    """Greedy generation with the KV cache: feed back the argmax, stop after EOS. Returns tokens and logits."""
    src_pad = src == model.cfg.pad_id
    memory = model.encode(src, src_pad)
    cache = model.new_cache()
    token, tokens, steps = bos, [], []
    for _ in range(max_steps):
        logits = model.decode_step(torch.tensor([[token]]), memory, src_pad, cache)[0, -1]   # (vocab,)
        steps.append(logits)
        token = int(logits.argmax())
        tokens.append(token)
        if token == eos:
            break
    return tokens, steps


@check("D5", "vocabulary head → softmax; the chosen token is fed back; generation stops at EOS")
def vocabulary_head_and_feedback() -> Reading:
    # An untrained model whose (untied) head reads out `I gave him a book yesterday . EOS`: row t of the
    # head is the unit vector of the decoder state after the right-shifted prefix of length t + 1. The
    # states depend only on the fed-back tokens, so greedy decoding walks the sentence only if every
    # step feeds back its choice, and it must stop at EOS before the 12 steps allowed.
    model = seeded_model(9, tie_target=False)
    v = ex.TARGET_VOCAB
    chain = [v[t] for t in ex.TARGET_LABELS]
    src = source_ids(ex.NINE_UNITS)
    with torch.no_grad():
        memory = model.encode(src)
        hidden = model.decode(target_ids(ex.TARGET_INPUT), memory, src == 0)[0]     # (tgt, d)
        wired = torch.zeros_like(model.head.weight)                             # (vocab, d)
        for t, token in enumerate(chain):
            wired[token] = hidden[t] / hidden[t].norm()
        model.head.weight.copy_(wired)
        tokens, logits = greedy_with_cache(model, src, v[ex.BOS], v[ex.EOS], max_steps=12)
        probs = torch.softmax(logits[0], dim=-1)
        inputs = [v[ex.BOS], *tokens[:-1]]
        forced = model(src, torch.tensor([inputs]))[0]                      # teacher forcing on the output
    fed_back = diff(torch.stack(logits), forced) if len(logits) == len(forced) else math.inf
    # the per-row walk over the teacher-forced logits: every row's next token is its own top choice
    walk = next_token_walk(forced, inputs, v[ex.EOS], finished=tokens[-1] == v[ex.EOS], top=1)
    top_rows = sum(r.rank == 1 for r in walk)
    width = logits[0].shape[0]
    words = " ".join(next(w for w, i in v.items() if i == t) for t in tokens)
    return reading("logits over {width} target tokens, softmax sums to {total:.12f}; greedy: {words} "
                   "({steps} steps of 12 allowed); steps = teacher-forced on the fed-back tokens |Δ| = {fed_back:Δ}; "
                   "rows whose next token is their top choice {top_rows}/{steps}",
                   width == model.cfg.tgt_vocab and abs(float(probs.sum()) - 1) <= EXACT and fed_back <= 1e-8
                   and tokens == chain and top_rows == len(tokens), tolerance={"exact": EXACT, "fed_back": 1e-8},
                   width=width, total=float(probs.sum()), words=words, steps=len(tokens), fed_back=fed_back,
                   top_rows=top_rows)


@check("D6", "teacher-forced logits = step-by-step recomputed = KV-cached (fp32)")
def cached_equals_teacher_forced() -> Reading:
    cfg = ModelConfig.tiny(src_vocab=len(ex.SOURCE_VOCAB), tgt_vocab=len(ex.TARGET_VOCAB))   # fp32, fast path
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(10)
        model = Transformer(cfg).eval()
    src, tgt = source_ids(ex.NINE_UNITS), target_ids(ex.TARGET_INPUT)
    m = tgt.size(1)
    with torch.no_grad():
        forced = model(src, tgt)[0]                                          # (tgt, vocab)
        recomputed = torch.stack([model(src, tgt[:, : t + 1])[0, -1] for t in range(m)])
        src_pad = src == 0
        memory = model.encode(src, src_pad)
        cache = model.new_cache()
        cached, cross_k = [], None
        for t in range(m):
            cached.append(model.decode_step(tgt[:, t: t + 1], memory, src_pad, cache)[0, -1])
            if t == 0:
                cross_k = cache.cross[model.decoder.layers[0].cross_attention][0]
        cached = torch.stack(cached)
    once = cache.cross[model.decoder.layers[0].cross_attention][0] is cross_k and cache.length == m
    a, b = diff(forced, recomputed), diff(forced, cached)
    return reading("{positions} positions: |teacher − recomputed| = {recomputed:Δ}, |teacher − cached| = "
                   "{cached:Δ}; self cache {cache_rows} rows, cross K/V computed once: {once}",
                   a <= 1e-5 and b <= 1e-5 and once, tolerance={"float32": 1e-5}, positions=m, recomputed=a,
                   cached=b, cache_rows=cache.length, once=once)


@check("D7", "base: 6+6 layers, d 512, 8 heads, d_k = d_v = 64, d_ff 2048")
def base_size() -> Reading:
    cfg = ModelConfig.base()
    with torch.device("meta"):
        model = Transformer(cfg)
    mha = model.encoder.layers[0].self_attention
    shapes = {"w_q": tuple(mha.w_q.weight.shape), "w_o": tuple(mha.w_o.weight.shape),
              "w_1": tuple(model.encoder.layers[0].ffn.w_1.weight.shape),
              "w_2": tuple(model.decoder.layers[0].ffn.w_2.weight.shape)}
    n_enc, n_dec = len(model.encoder.layers), len(model.decoder.layers)
    ok = (n_enc, n_dec) == (6, 6) and (mha.heads, mha.d_k, mha.d_v, mha.d_model) == (8, 64, 64, 512) and shapes == {
        "w_q": (8 * 64, 512), "w_o": (512, 8 * 64), "w_1": (2048, 512), "w_2": (512, 2048)}
    ok &= all(tuple(getattr(layer.cross_attention, w).weight.shape) == (512, 512)
              for layer in model.decoder.layers for w in ("w_q", "w_k", "w_v", "w_o"))
    return reading("{encoder}+{decoder} layers, d {d_model}, {heads} heads, d_k {d_k}, d_v {d_v}; "
                   "W^Q {w_q[1]}×{w_q[0]}, W^O {w_o[1]}×{w_o[0]}, W_1 {w_1[1]}→{w_1[0]}", ok,
                   encoder=n_enc, decoder=n_dec, d_model=mha.d_model, heads=mha.heads, d_k=mha.d_k, d_v=mha.d_v,
                   **{k: list(v) for k, v in shapes.items()})


