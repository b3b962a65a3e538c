"""Chapter E, batches and masks: the two-sentence batch (lesson/views.py), its padding, causal and loss masks."""

from __future__ import annotations

import math

import numpy as np
import torch

from ..views import lesson_batch
from .common import EXACT, diff, seeded_model
from .registry import Reading, check, reading


@check("E1", "source padding: B's positions 2–5 are never valid keys (encoder, cross-attention)")
def source_padding_hidden() -> Reading:
    model = seeded_model(11)
    batch = lesson_batch()
    src, tgt = batch.src, batch.tgt_in
    pad = batch.source_padding[1]
    with torch.no_grad(), model.probes("encoder.*.self_attention.head.*.weights",
                                       "decoder.*.cross_attention.head.*.weights") as trace:
        model(src, tgt)
    pad_max, valid_min = 0.0, math.inf
    for w in trace.records.values():
        pad_max = max(pad_max, float(w[1][:, pad].abs().max()))
        valid_min = min(valid_min, float(w[1][:, ~pad].min()))
    views_hide = not bool(batch.encoder_self[1][:, pad].any()) and not bool(batch.cross[1][:, pad].any())
    return reading("B's PAD positions {pad}: max weight {pad_max:Δ} over {tables} tables; valid keys ≥ "
                   "{valid_min:.4f}; the batch view's encoder and cross masks hide them: {views_hide}",
                   pad.tolist() == [False, False, True, True, True, True] and pad_max == 0 and valid_min > 0
                   and views_hide, pad=torch.nonzero(pad).flatten().tolist(), pad_max=pad_max,
                   tables=len(trace.records), valid_min=valid_min, views_hide=views_hide)


@check("E2", "target masks: the 6×6 causal table combined with each sample's key padding")
def target_masks() -> Reading:
    model = seeded_model(12)
    batch = lesson_batch()
    src, tgt, tgt_pad = batch.src, batch.tgt_in, batch.target_padding
    tri, combined = batch.causal, batch.decoder_self                          # (query, key), (batch, query, key)
    want = np.tril(np.ones((6, 6), bool))[None] & ~tgt_pad.numpy()[:, None, :]
    with torch.no_grad(), model.probes("decoder.*.self_attention.head.*.weights") as trace:
        model(src, tgt, tgt_pad=tgt_pad)
    traced = all(np.array_equal(w.numpy() > 0, want) for w in trace.records.values())
    counts = [int(c.sum()) for c in combined]
    return reading("causal {causal}/36 visible; combined A {counts[0]}, B {counts[1]}; {tables} traced decoder "
                   "tables match", np.array_equal(tri.numpy(), np.tril(np.ones((6, 6), bool)))
                   and np.array_equal(combined.numpy(), want) and traced and counts == [21, 18],
                   causal=int(tri.sum()), counts=counts, tables=len(trace.records))


@check("E3", "loss mask: exactly three loss terms count for B")
def loss_mask_terms() -> Reading:
    model = seeded_model(13)
    batch = lesson_batch()
    src, tgt, labels = batch.src, batch.tgt_in, batch.labels
    with torch.no_grad():
        total, n = model.loss(src, tgt, labels)
        loss_b, n_b = model.loss(src[1:], tgt[1:], labels[1:])
        logits = model(src[1:], tgt[1:])[0].numpy()
    lab = labels[1].numpy()
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    want = -sum(logp[i, lab[i]] for i in range(len(lab)) if lab[i] != 0)
    err = abs(float(loss_b) - want)
    mask_b = batch.loss_terms[1]
    return reading("terms: B {terms_b}, batch {terms}; loss_mask(B) {mask_b}; B's loss = Σ of its 3 terms |Δ| = "
                   "{loss:Δ}", n_b == 3 and n == 9 and mask_b == 3 and err <= 1e-4 * max(1.0, abs(want)),
                   tolerance={"relative": 1e-4}, terms_b=int(n_b), terms=int(n), mask_b=mask_b, loss=err)


@check("E4", "padding changes nothing real: valid outputs and loss are unchanged")
def padding_changes_nothing() -> Reading:
    model = seeded_model(14)
    batch = lesson_batch()
    src, tgt, labels = batch.src, batch.tgt_in, batch.labels
    alone_src, alone_tgt, alone_lab = src[1:, :2], tgt[1:, :3], labels[1:, :3]
    with torch.no_grad():
        padded = model(src, tgt)[1, :3]
        alone = model(alone_src, alone_tgt)[0]
        loss_alone, _ = model.loss(alone_src, alone_tgt, alone_lab)
        loss_padded, _ = model.loss(src[1:], tgt[1:], labels[1:])
        wider = (torch.nn.functional.pad(src, (0, 3)), torch.nn.functional.pad(tgt, (0, 2)))
        a_wide, a = model(*wider)[0, :6], model(src, tgt)[0]
    out, more = diff(padded, alone), diff(a_wide, a)
    loss = abs(float(loss_alone) - float(loss_padded))
    return reading("B in the batch vs alone: logits |Δ| = {logits:Δ}, loss |Δ| = {loss:Δ}; "
                   "A with 3 more source and 2 more target PAD |Δ| = {wider:Δ}",
                   out <= EXACT and more <= EXACT and loss <= 1e-5, tolerance={"exact": EXACT, "loss": 1e-5},
                   logits=out, loss=loss, wider=more)
