"""The sub-layers and layers of the lesson.

    U = LN(X + MHA(X))                  Z = LN(U + FFN(U))                  (post-norm, 2017)
    FFN(u) = ReLU(u W_1 + b_1) W_2 + b_2, the same weights at every position

An EncoderLayer is those two sub-layers; a DecoderLayer puts cross-attention to the encoder output H
between them. Each layer has one forward: the whole sequence at once, or (with a KV cache) the newest
rows of an incremental decoding step; hook points name every value the lesson draws (docs/probes.md).
"""

from __future__ import annotations

from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from .attention import CrossAttention, SelfAttention
from .cache import KVCache
from .config import ModelConfig
from .hooks import HookPoint
from .positions import RelativePositionBias, RotaryEmbedding

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "silu": F.silu}


class ResidualNorm(nn.Module):
    """One sub-layer's residual path and LayerNorm.

    post (2017): LN(x + Dropout(Sub(x)))      pre: x + Dropout(Sub(LN(x)))
    LayerNorm works over the d features of each position alone.
    Hook points: `input` x, `residual` (the sum), `normed` (the LayerNorm's output).
    """

    def __init__(self, d_model: int, eps: float, placement: str, dropout: float) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(d_model, eps=eps)
        self.placement = placement
        self.dropout = nn.Dropout(dropout)
        self.input = HookPoint()
        self.residual = HookPoint()
        self.normed = HookPoint()

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        x = self.input(x)                                                    # (batch, len, d)
        if self.placement == "post":
            residual = self.residual(x + self.dropout(sublayer(x)))
            return self.normed(self.layer_norm(residual))
        return self.residual(x + self.dropout(sublayer(self.normed(self.layer_norm(x)))))


class FeedForward(nn.Module):
    """FFN(x) = ReLU(x W_1 + b_1) W_2 + b_2, the same weights at every position, each row alone.

    `activation="silu"` (x * sigmoid(x), "swish" in Marian / OPUS-MT) in place of ReLU.
    Hook points: `hidden` (.., d_ff), `output` (.., d)."""

    def __init__(self, d_model: int, d_ff: int, bias: bool = True, activation: str = "relu") -> None:
        super().__init__()
        self.activation = ACTIVATIONS[activation]
        self.w_1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w_2 = nn.Linear(d_ff, d_model, bias=bias)
        self.hidden = HookPoint()
        self.output = HookPoint()
        nn.init.xavier_uniform_(self.w_1.weight)
        nn.init.xavier_uniform_(self.w_2.weight)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.hidden(self.activation(self.w_1(x)))                  # (batch, len, d_ff)
        return self.output(self.w_2(hidden))                                 # (batch, len, d)


def _attention(cfg: ModelConfig) -> SelfAttention:
    rope = RotaryEmbedding(cfg.d_k, cfg.rope_base) if cfg.positions == "rope" else None
    relative = RelativePositionBias(cfg.heads, cfg.relative_clip) if cfg.positions == "relative" else None
    return SelfAttention(cfg.d_model, cfg.heads, cfg.d_k, cfg.d_v, bias=cfg.bias, dropout=cfg.attention_dropout,
                         scale=cfg.scale_scores, rope=rope, relative=relative, path=cfg.attention_path)


def _cross_attention(cfg: ModelConfig) -> CrossAttention:
    return CrossAttention(cfg.d_model, cfg.heads, cfg.d_k, cfg.d_v, bias=cfg.bias, dropout=cfg.attention_dropout,
                          scale=cfg.scale_scores, path=cfg.attention_path)


class EncoderLayer(nn.Module):
    """Self-attention over all (non-PAD) source positions, then FFN; each with residual + norm.

    Hook point `output`: the layer's output rows."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attention = _attention(cfg)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.bias, cfg.activation)
        self.sublayer = nn.ModuleList(
            ResidualNorm(cfg.d_model, cfg.eps, cfg.norm_placement, cfg.dropout) for _ in range(2))
        self.output = HookPoint()

    def forward(self, x: Tensor, mask: Tensor | None = None, *, causal: bool = False) -> Tensor:
        """x: (batch, src, d); mask True = may attend (key padding, or any visibility table)."""
        x = self.sublayer[0](x, lambda h: self.self_attention(h, mask, causal=causal))   # U = LN(X + MHA(X))
        return self.output(self.sublayer[1](x, self.ffn))                    # (batch, src, d)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder output H, FFN; each with residual + norm.

    With `cross=False` it is the two-sub-layer causal block of a decoder-only model.
    Hook point `output`: the layer's output rows.
    """

    def __init__(self, cfg: ModelConfig, cross: bool = True) -> None:
        super().__init__()
        self.self_attention = _attention(cfg)
        self.cross_attention = _cross_attention(cfg) if cross else None
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.bias, cfg.activation)
        n = 3 if cross else 2
        self.sublayer = nn.ModuleList(
            ResidualNorm(cfg.d_model, cfg.eps, cfg.norm_placement, cfg.dropout) for _ in range(n))
        self.output = HookPoint()

    def forward(self, y: Tensor, memory: Tensor | None = None, self_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, *, causal: bool = True, cache: KVCache | None = None) -> Tensor:
        """y: (batch, tgt, d), the whole target, or with `cache` only its newest rows; memory: (batch, src, d);
        masks True = may attend."""
        y = self.sublayer[0](y, lambda h: self.self_attention(h, self_mask, causal=causal, cache=cache))
        if self.cross_attention is not None:                                 # memory: None once the cache has K/V
            y = self.sublayer[1](y, lambda h: self.cross_attention(h, memory, memory_mask, cache=cache))
        return self.output(self.sublayer[-1](y, self.ffn))                   # (batch, tgt, d)
