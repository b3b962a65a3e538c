"""A static KV cache: every layer's key/value rows preallocated once, written in place at each step.

Self-attention rows go to position `length` of a (batch, heads, capacity, d) buffer; a step reads the
first `length` rows as a view (no copy, no re-concatenation). Cross-attention K/V are projected from
the encoder output on the first step and kept. Beam search reorders the batch rows with `reorder`.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

from ..model.attention import guard_empty_rows
from ..model.masks import padding_mask


class StaticCache:
    """K/V of every decoder layer for incremental decoding, allocated on the first step."""

    def __init__(self, n_layers: int, capacity: int) -> None:
        self.n_layers, self.capacity = n_layers, capacity
        self.k: list[Tensor] = []            # per layer (batch, heads, capacity, d_k)
        self.v: list[Tensor] = []            # per layer (batch, heads, capacity, d_v)
        self.cross: list[tuple[Tensor, Tensor]] = []   # per layer (batch, heads, src, d_k), (.., d_v)
        self.length = 0
        self._source: tuple[weakref.ref, tuple] | None = None

    def allocate(self, batch: int, heads: int, d_k: int, d_v: int, like: Tensor) -> None:
        if self.k:
            return
        self.k = [like.new_empty(batch, heads, self.capacity, d_k) for _ in range(self.n_layers)]
        self.v = [like.new_empty(batch, heads, self.capacity, d_v) for _ in range(self.n_layers)]

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write this step's row (batch, heads, 1, d) at `length`; every row so far as views."""
        n = self.length + 1
        if n > self.capacity:                                                # longer than planned: grow
            self.capacity *= 2
            self.k = [torch.cat([t, torch.empty_like(t)], dim=2) for t in self.k]
            self.v = [torch.cat([t, torch.empty_like(t)], dim=2) for t in self.v]
        self.k[layer][:, :, self.length: n].copy_(k)
        self.v[layer][:, :, self.length: n].copy_(v)
        return self.k[layer][:, :, :n], self.v[layer][:, :, :n]             # (batch, heads, key, d)

    def source_visibility(self, src_pad: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
        """(cross-attention mask (batch, 1, 1, src) or None, keep (batch, 1, 1, 1) or None), worked out once
        per src_pad tensor: no mask when nothing is PAD; a row whose source is all PAD sees every key
        and is zeroed by `keep` (as guard_empty_rows does), so it gives zeros, never NaN."""
        if src_pad is None:
            return None, None
        if self._source is None or self._source[0]() is not src_pad:
            result = guard_empty_rows(padding_mask(src_pad)) if bool(src_pad.any()) else (None, None)
            self._source = (weakref.ref(src_pad), result)
        return self._source[1]

    def reorder(self, index: Tensor) -> None:
        """Follow the beams (or drop finished sentences): keep batch rows `index`."""
        self._source = None
        self.k = [self._take(t, index) for t in self.k]
        self.v = [self._take(t, index) for t in self.v]
        self.cross = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.cross]

    def _take(self, t: Tensor, index: Tensor) -> Tensor:
        """Rows `index` of a buffer, copying only the `length` rows written so far."""
        n = self.length
        if index.numel() == t.size(0):                                       # beams: same batch, in place
            t[:, :, :n] = t[:, :, :n].index_select(0, index)
            return t
        out = t.new_empty(index.numel(), *t.shape[1:])                      # sentences left the batch
        out[:, :, :n] = t[:, :, :n].index_select(0, index)
        return out
