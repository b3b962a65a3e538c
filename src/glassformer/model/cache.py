"""The KV cache of incremental decoding: keys and values written once, in preallocated buffers.

Decoding feeds only the newest target row at each step; its self-attention needs the keys and values
of every earlier row. Each self-attention module writes its rows into its own (batch, heads, capacity, d)
buffer at position `length` (`update`) and reads rows :length+new back as views: no re-concatenation.
Cross-attention's K = H W^K, V = H W^V depend only on the encoder output H: projected on the first
step, kept in `cross`. `reorder(index)` keeps batch rows `index`: beams following their parents, or
(an index shorter than the batch) finished sentences leaving it.

    cache = model.new_cache()                        # capacity cfg.max_len; the batch comes with step 1
    logits = model.decode_step(tokens, memory, src_pad, cache)
"""

from __future__ import annotations

import weakref

from torch import Tensor, nn


class KVCache:
    """Every attention module's cached K/V for one decoding run, and how many target positions it holds."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity                                    # positions allocated per buffer
        self.length = 0                                             # target positions written so far
        self.k: dict[nn.Module, Tensor] = {}                        # self-attention -> (batch, heads, capacity, d_k)
        self.v: dict[nn.Module, Tensor] = {}                        # self-attention -> (batch, heads, capacity, d_v)
        self.cross: dict[nn.Module, tuple[Tensor, Tensor]] = {}    # cross-attention -> K, V (batch, heads, src, d)
        self._source: tuple[weakref.ref, Tensor | None] | None = None   # (src_pad, what cross-attention gets)

    def update(self, attention: nn.Module, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write this step's rows k, v (batch, heads, new, d) at positions length..; return rows :length+new."""
        new, end = k.size(2), self.length + k.size(2)
        keys, values = self.k.get(attention), self.v.get(attention)
        if keys is None or end > keys.size(2):
            keys = self.k[attention] = self._grown(keys, k, end)
            values = self.v[attention] = self._grown(values, v, end)
        keys.narrow(2, self.length, new).copy_(k)                           # rows length..end
        values.narrow(2, self.length, new).copy_(v)
        return keys.narrow(2, 0, end), values.narrow(2, 0, end)             # (batch, heads, key, d)

    def _grown(self, buffer: Tensor | None, rows: Tensor, end: int) -> Tensor:
        """A buffer for `end` positions at least: `capacity` on the first step, doubled past it."""
        size = self.capacity if buffer is None else 2 * buffer.size(2)
        out = rows.new_empty(rows.size(0), rows.size(1), max(size, end), rows.size(3))
        if buffer is not None:
            out[:, :, :self.length] = buffer[:, :, :self.length]
        return out

    def advance(self, new: int) -> None:
        """Every layer has written this step's `new` rows: the next step starts after them."""
        self.length += new

    def source_padding(self, src_pad: Tensor | None) -> Tensor | None:
        """src_pad, or None when it flags no PAD, so cross-attention runs unmasked (no mask, no empty-row
        check and its host sync): looked at once per src_pad tensor, not at every step and layer."""
        if src_pad is None:
            return None
        if self._source is None or self._source[0]() is not src_pad:
            self._source = (weakref.ref(src_pad), src_pad if bool(src_pad.any()) else None)
        return self._source[1]

    def reorder(self, index: Tensor, *, same_source: bool = False) -> None:
        """Keep batch rows `index` (batch,) or fewer: beams follow their parents, finished sentences leave.

        same_source: row i of `index` reads the same source as row i did (beams of one sentence moving
        within it, no sentence leaving), so the cross-attention K/V rows stay as they are."""
        for buffers in (self.k, self.v):
            for attention, t in buffers.items():
                buffers[attention] = self._take(t, index)
        if same_source:
            return
        self._source = None
        self.cross = {attention: (k.index_select(0, index), v.index_select(0, index))
                      for attention, (k, v) in self.cross.items()}

    def _take(self, t: Tensor, index: Tensor) -> Tensor:
        """Rows `index` of a buffer, copying only the `length` positions written so far."""
        n = self.length
        out = t if index.numel() == t.size(0) else t.new_empty(index.numel(), *t.shape[1:])
        out[:, :, :n] = t[:, :, :n].index_select(0, index)                 # index_select copies first
        return out
