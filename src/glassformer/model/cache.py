"""The KV cache of incremental decoding: keys and values written once, in static buffers.

Decoding feeds only the newest target row at each step; its self-attention needs the keys and values
of every earlier row. Each self-attention module keeps a zeroed (batch, heads, positions, d) buffer: a
step writes its rows at their positions with `index_copy_` and its queries read the whole buffer through
the mask `key position <= query position` (`update`), so a step's shapes do not change from one step to
the next (a compiled step is one graph for every step). A full buffer grows by GROW positions.
Cross-attention's K = H W^K, V = H W^V depend only on the encoder output H: projected on the first step,
kept in `cross`. `reorder(index)` keeps batch rows `index`: beams following their parents, or (an index
shorter than the batch) finished sentences leaving it.

    cache = model.new_cache()
    logits = model.decode_step(tokens, memory, src_pad, cache)

A compiled step (glassformer.inference.compiler) runs the same code over a cache made of its inputs,
`KVCache(position=pos, ...)`: its position is a 0-dim tensor, not a count the host keeps, and its run grows
the buffers between steps.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor, nn

GROW = 8                      # positions a buffer is allocated with, and added when it is full


class KVCache:
    """Every attention module's cached K/V for one decoding run, and how many target positions it holds."""

    def __init__(self, capacity: int | None = None, *, position: Tensor | None = None,
                 k: dict | None = None, v: dict | None = None, cross: dict | None = None,
                 joined: Tensor | None = None) -> None:
        self.capacity = capacity or GROW                            # positions of a first buffer
        self.length = 0                                            # target positions written so far
        self.position = position                                   # a compiled step's first position (0-dim)
        self.joined = joined            # (batch,) the column each row's sentence began at (None: every row at 0)
        self.at: Tensor | None = None                              # this step's positions (new,), `start`
        self.k: dict[nn.Module, Tensor] = k or {}                  # self-attention -> (batch, heads, positions, d_k)
        self.v: dict[nn.Module, Tensor] = v or {}                  # self-attention -> (batch, heads, positions, d_v)
        self.cross: dict[nn.Module, tuple[Tensor, Tensor]] = cross or {}   # cross-attention -> K, V (.., src, d)
        self._source: tuple[weakref.ref, Tensor | None] | None = None   # (src_pad, what cross-attention gets)

    def start(self, new: int, device: torch.device) -> Tensor:
        """This step's `new` rows: their absolute positions (new,), kept in `at` for every layer until
        `advance`. Buffers that cannot hold them grow first (a compiled step's run grows them before the step)."""
        if self.at is not None:
            return self.at
        if self.position is None:
            self.reserve(new)
        first = self.length if self.position is None else self.position
        self.at = torch.arange(new, device=device) + first
        return self.at

    def reserve(self, new: int) -> None:
        """Grow every buffer that cannot hold `new` more positions by GROW positions (zeros), or to fit them."""
        end = self.length + new
        for buffers in (self.k, self.v):
            for attention, t in buffers.items():
                if end > t.size(2):                                 # each number written once: t, then zeros
                    more = t.new_zeros(*t.shape[:2], max(GROW, end - t.size(2)), t.size(3))
                    buffers[attention] = torch.cat([t, more], dim=2)

    def update(self, attention: nn.Module, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Write this step's rows k, v (batch, heads, new, d) at positions `at`; return the whole buffers
        (batch, heads, positions, d) and which of their keys each new row may see (new, positions)."""
        self.start(k.size(2), k.device)
        keys, values = self.k.get(attention), self.v.get(attention)
        if keys is None:                                            # the first step: zeroed buffers
            size = max(self.capacity, self.length + k.size(2))
            keys = self.k[attention] = k.new_zeros(*k.shape[:2], size, k.size(3))
            values = self.v[attention] = v.new_zeros(*v.shape[:2], size, v.size(3))
        keys.index_copy_(2, self.at, k)
        values.index_copy_(2, self.at, v)
        columns = torch.arange(keys.size(2), device=k.device)
        visible = columns <= self.at[:, None]                                # (new, positions)
        if self.joined is not None:                       # a row sees its own sentence's columns only
            visible = visible & (columns >= self.joined[:, None, None])      # (batch, new, positions)
        return keys, values, visible

    def positions(self, at: Tensor) -> Tensor:
        """The positions within each row's sentence of the columns `at` (new,): `at` itself, or (batch, new)
        where rows joined at other columns."""
        return at if self.joined is None else at[None, :] - self.joined[:, None]

    def advance(self, new: int) -> None:
        """Every layer has written this step's `new` rows: the next step starts after them."""
        self.length += new
        self.at = None

    def source_padding(self, src_pad: Tensor | None) -> Tensor | None:
        """src_pad, or None when it flags no PAD, so cross-attention runs unmasked (no mask, no empty-row
        check and its host sync): looked at once per src_pad tensor, not at every step and layer. A compiled
        step's cache gives src_pad as it is (its graph does not branch on values)."""
        if src_pad is None or self.position is not None:
            return src_pad
        if self._source is None or self._source[0]() is not src_pad:
            self._source = (weakref.ref(src_pad), src_pad if bool(src_pad.any()) else None)
        return self._source[1]

    def reorder(self, index: Tensor, *, same_source: bool = False) -> None:
        """Keep batch rows `index` (batch,) or fewer: beams follow their parents, finished sentences leave.
        The rows are gathered into new buffers (a compiled step returns them).

        same_source: row i of `index` reads the same source as row i did (beams of one sentence moving
        within it, no sentence leaving), so the cross-attention K/V rows stay as they are."""
        self.k = {attention: t.index_select(0, index) for attention, t in self.k.items()}
        self.v = {attention: t.index_select(0, index) for attention, t in self.v.items()}
        self.joined = None if self.joined is None else self.joined.index_select(0, index)
        if same_source:
            return
        self._source = None
        self.cross = {attention: (k.index_select(0, index), v.index_select(0, index))
                      for attention, (k, v) in self.cross.items()}
