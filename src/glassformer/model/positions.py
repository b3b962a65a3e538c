"""Position schemes: the sinusoidal table, a learned table, a relative bias b_{i-j}, and RoPE."""

from __future__ import annotations

import torch
from torch import Tensor, nn

POSITION_LAYOUTS = ("interleaved", "halves")


def sinusoidal_positions(n: int, d: int, dtype: torch.dtype = torch.float32, layout: str = "interleaved") -> Tensor:
    """(n, d) table: PE(p, 2r) = sin(p / 10000^(2r/d)), PE(p, 2r+1) = cos(p / 10000^(2r/d)).

    layout "halves" puts the same values as [all sines | all cosines] (Marian / OPUS-MT): channel r is
    sin(p / 10000^(2r/d)) for r < ceil(d/2), the cosines follow."""
    if layout not in POSITION_LAYOUTS:
        raise ValueError(f"position layout must be one of {POSITION_LAYOUTS}, got {layout!r}")
    p = torch.arange(n, dtype=torch.float64).unsqueeze(1)                  # (n, 1)
    two_r = torch.arange(0, d, 2, dtype=torch.float64)                     # (ceil(d/2),)
    angle = p / torch.pow(10000.0, two_r / d)                              # (n, ceil(d/2))
    sin, cos = torch.sin(angle), torch.cos(angle[:, : d // 2])             # (n, ceil(d/2)), (n, d//2)
    if layout == "halves":
        return torch.cat([sin, cos], dim=1).to(dtype)                      # (n, d)
    table = torch.zeros(n, d, dtype=torch.float64)
    table[:, 0::2] = sin
    table[:, 1::2] = cos
    return table.to(dtype)


class LearnedPositions(nn.Module):
    """A trained vector per absolute position (the alternative the 2017 paper compared)."""

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.table = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.table.weight, std=0.02)

    def forward(self, positions: Tensor) -> Tensor:
        return self.table(positions)                                       # (len, d)


class RelativePositionBias(nn.Module):
    """A learned scalar b_{i-j} per head, added to the scores; offsets clipped to [-clip, clip]."""

    def __init__(self, heads: int, clip: int) -> None:
        super().__init__()
        self.clip = clip
        self.bias = nn.Parameter(torch.zeros(heads, 2 * clip + 1))          # (heads, offsets)
        nn.init.normal_(self.bias, std=0.02)

    def forward(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        offset = (q_pos[:, None] - k_pos[None, :]).clamp(-self.clip, self.clip) + self.clip
        return self.bias[:, offset]                                        # (heads, query, key)


class RotaryEmbedding(nn.Module):
    """RoPE: rotate each pair of dimensions (2r, 2r+1) of q and k by angle position * theta_r.

    q~_i = R(i theta) q_i, k~_j = R(j theta) k_j, so q~_i . k~_j depends on j - i only.
    """

    def __init__(self, d_k: int, base: float = 10000.0) -> None:
        super().__init__()
        theta = base ** (-torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)   # (d_k/2,)
        self.register_buffer("theta", theta, persistent=False)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """x: (batch, heads, len, d_k); positions: (len,) absolute positions of the rows."""
        angle = positions.to(torch.float64)[:, None] * self.theta[None, :]  # (len, d_k/2)
        cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
        even, odd = x[..., 0::2], x[..., 1::2]                              # (batch, heads, len, d_k/2)
        out = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
        return out.flatten(-2)                                             # (batch, heads, len, d_k)
