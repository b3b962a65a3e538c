"""Packed rows: position-wise work (projections, FFN, LayerNorm, residuals) on real tokens only.

A padded batch (batch, len, d) spends a third or more of its rows on PAD. Every sub-layer except the
attention core treats each row alone, so training can keep just the real rows, (n, d), and lay them
back into the padded grid only where rows meet: inside attention (Q K^T, softmax, . V). The rows that
matter get exactly the same numbers; PAD rows are simply never computed.
"""

from __future__ import annotations

from torch import Tensor


class Rows:
    """Which cells of a (batch, len) grid hold real rows, and how to move between packed and padded."""

    def __init__(self, keep: Tensor) -> None:
        """keep: (batch, len) boolean, True = a row to compute."""
        self.batch, self.length = keep.shape
        self.index = keep.reshape(-1).nonzero().squeeze(1)                 # (n,) flat cell numbers
        self.positions = self.index % self.length                           # (n,) position within its row

    def __len__(self) -> int:
        return self.index.numel()

    def pack(self, x: Tensor) -> Tensor:
        """(batch, len, w) -> (n, w): the real rows, in batch-major order."""
        return x.reshape(self.batch * self.length, x.size(-1)).index_select(0, self.index)

    def unpack(self, x: Tensor) -> Tensor:
        """(n, w) -> (batch, len, w), zeros in the cells that are not kept."""
        grid = x.new_zeros(self.batch * self.length, x.size(-1))
        return grid.index_copy(0, self.index, x).view(self.batch, self.length, x.size(-1))

    def select(self, values: Tensor) -> Tensor:
        """Per-cell values (batch, len) -> (n,), aligned with the packed rows."""
        return values.reshape(-1).index_select(0, self.index)
