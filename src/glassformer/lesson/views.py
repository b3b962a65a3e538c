"""The lesson's derived views, built once: the two-sentence batch with its masks, and the per-row walk.

`lesson_batch()` is the batch of chapter E (A = 我 昨天 给了 她 一本 书, B = 她 笑了 + PAD) as ids and
every mask the model builds for it, by the model's own mask functions — `glassformer lesson`, the lab's
Masks view and the checks E1–E4 all read it from here. `next_token_walk` (glassformer/model/readout.py) reads a
sentence's logits row by row; `explain`, the lab's Sentence view and the checks use that one function.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..model.masks import causal_mask, combine, loss_mask, padding_mask
from ..model.readout import NextToken, next_token_walk, walk_inputs
from . import examples as ex

__all__ = ["LessonBatch", "NextToken", "lesson_batch", "next_token_walk", "source_ids", "target_ids", "walk_inputs"]


def source_ids(*sentences) -> Tensor:
    """(batch, src) ids of source sentences given as lists of units (the lesson's vocabulary)."""
    return torch.tensor([ex.ids(s, ex.SOURCE_VOCAB) for s in sentences])


def target_ids(*sentences) -> Tensor:
    """(batch, tgt) ids of target sentences given as lists of words (the lesson's vocabulary)."""
    return torch.tensor([ex.ids(s, ex.TARGET_VOCAB) for s in sentences])


@dataclass(frozen=True)
class LessonBatch:
    """The two-sentence batch: units, ids, PAD flags and masks (True = may attend / counts)."""

    src: Tensor               # (batch, src) ids
    tgt_in: Tensor            # (batch, tgt) right-shifted target input ids
    labels: Tensor            # (batch, tgt) label ids
    source_padding: Tensor    # (batch, src) True = PAD
    target_padding: Tensor    # (batch, tgt) True = PAD
    causal: Tensor            # (tgt, tgt) query may see key
    encoder_self: Tensor      # (batch, src, src)
    decoder_self: Tensor      # (batch, tgt, tgt) causal AND key padding
    cross: Tensor             # (batch, tgt, src)
    loss_mask: Tensor         # (batch, tgt) labels that count

    @property
    def loss_terms(self) -> list[int]:
        return [int(n) for n in self.loss_mask.sum(dim=1)]

    def to_json(self) -> dict:
        """Plain JSON: the sentences as units/words, then every mask as nested booleans."""
        return {"samples": ["A", "B"],
                "source": [list(s) for s in ex.BATCH_SOURCE],
                "target_input": [list(t) for t in ex.BATCH_TARGET_INPUT],
                "labels": [list(t) for t in ex.BATCH_LABELS],
                **{name: getattr(self, name).tolist() for name in (
                    "source_padding", "target_padding", "causal", "encoder_self", "decoder_self", "cross",
                    "loss_mask")},
                "loss_terms": self.loss_terms}


def lesson_batch() -> LessonBatch:
    """The lesson's two-sentence batch, its masks built by glassformer.model.masks."""
    src, tgt_in = source_ids(*ex.BATCH_SOURCE), target_ids(*ex.BATCH_TARGET_INPUT)       # (2, 6), (2, 6)
    labels = target_ids(*ex.BATCH_LABELS)                                                # (2, 6)
    src_pad = src == ex.SOURCE_VOCAB[ex.PAD]                                              # True = PAD
    tgt_pad = tgt_in == ex.TARGET_VOCAB[ex.PAD]
    n_src, n_tgt = src.size(1), tgt_in.size(1)
    causal = causal_mask(n_tgt)                                                           # (tgt, tgt)
    source_visible = padding_mask(src_pad)[:, 0]                                          # (batch, 1, src)
    return LessonBatch(
        src=src, tgt_in=tgt_in, labels=labels, source_padding=src_pad, target_padding=tgt_pad, causal=causal,
        encoder_self=source_visible.expand(-1, n_src, -1),                                # (batch, src, src)
        decoder_self=combine(causal, padding_mask(tgt_pad))[:, 0],                        # (batch, tgt, tgt)
        cross=source_visible.expand(-1, n_tgt, -1),                                       # (batch, tgt, src)
        loss_mask=loss_mask(labels, ex.TARGET_VOCAB[ex.PAD]))
