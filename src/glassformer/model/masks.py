"""Attention masks, one convention everywhere: boolean, True = may attend; padding flags True = PAD.

PyTorch disagrees with itself (SDPA: True = attend; nn.MultiheadAttention: True = blocked);
glassformer converts only at that boundary (`~mask`).
"""

from __future__ import annotations

import torch
from torch import Tensor


def causal_mask(n_query: int, n_key: int | None = None, offset: int = 0,
                device: torch.device | str | None = None) -> Tensor:
    """(query, key) table: query i (absolute position offset + i) may see key j iff j <= offset + i.

    With a KV cache the query rows are the newest positions, so `offset` = keys already cached;
    this is the bottom-right alignment that SDPA's `is_causal` does not give for one query.
    """
    n_key = n_query + offset if n_key is None else n_key
    q = torch.arange(n_query, device=device).unsqueeze(1) + offset  # (query, 1)
    k = torch.arange(n_key, device=device).unsqueeze(0)             # (1, key)
    return k <= q                                                    # (query, key)


def padding_mask(pad: Tensor) -> Tensor:
    """Key visibility from PAD flags: (batch, key) True = PAD  ->  (batch, 1, 1, key) True = may attend."""
    if pad.dtype != torch.bool:
        raise TypeError(f"padding flags must be boolean (True = PAD), got {pad.dtype}")
    return (~pad)[:, None, None, :]                                  # (batch, 1, 1, key)


def combine(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of visibility masks, broadcast together; None means 'no restriction'."""
    out = None
    for m in masks:
        if m is None:
            continue
        out = m if out is None else (out & m)
    return out


def as_attention_mask(mask: Tensor | None) -> Tensor | None:
    """Bring a (query, key), (batch, query, key) or (batch, 1|heads, query, key) mask to 4 dims."""
    if mask is None:
        return None
    if mask.dtype != torch.bool:
        raise TypeError(f"attention masks must be boolean (True = may attend), got {mask.dtype}")
    while mask.dim() < 4:
        mask = mask.unsqueeze(0) if mask.dim() == 2 else mask.unsqueeze(1)
    return mask


def loss_mask(labels: Tensor, pad_id: int = 0) -> Tensor:
    """Which label positions count in the loss: True where the label is not PAD."""
    return labels != pad_id
