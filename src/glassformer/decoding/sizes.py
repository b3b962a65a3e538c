"""How large decoding's pieces grow (decoding/search.py): each sentence's output limit, and the buckets a batch's
live sentences are padded up to (a compiled step's row counts)."""

from __future__ import annotations

import torch
from torch import Tensor

LENGTH_A, LENGTH_B = 2.0, 10      # output limit: a * source_len + b tokens


def output_limits(src_pad: Tensor, model_max_len: int, a: float = LENGTH_A, b: int = LENGTH_B) -> Tensor:
    """Most tokens each sentence may generate (EOS included): a * source_len + b, at most max_len."""
    src_len = (~src_pad).sum(dim=1)                                          # (batch,)
    return torch.clamp((src_len.double() * a).long() + b, max=model_max_len)


def sentence_limits(src_pad: Tensor, model_max_len: int, max_len: int | Tensor | None = None) -> Tensor:
    """Each sentence's output limit (batch,) on the CPU: `output_limits`, or `max_len` (one for all, or one
    per sentence), always capped by the model's max_len."""
    if max_len is None:
        return output_limits(src_pad, model_max_len).cpu()                  # at least min(LENGTH_B, max_len)
    if isinstance(max_len, int):
        limits = torch.full((src_pad.size(0),), min(max_len, model_max_len), dtype=torch.long)
    else:
        limits = torch.clamp(max_len.long().cpu(), max=model_max_len)
    if len(limits) != src_pad.size(0) or bool((limits < 1).any()):
        raise ValueError(f"max_len: expected limits >= 1, one per sentence, got {limits.tolist()}")
    return limits


SENTENCE_BUCKETS = (1, 2, 4, 8, 16, 32, 64)   # live sentences per step, padded up to one of these


def bucket(n: int, sizes: tuple[int, ...] = SENTENCE_BUCKETS) -> int:
    """The smallest size >= n; past the largest, n rounded up to a multiple of it."""
    for size in sizes:
        if n <= size:
            return size
    return -(-n // sizes[-1]) * sizes[-1]
