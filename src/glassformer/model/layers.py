"""FeedForward, the residual + LayerNorm placement, EncoderLayer (2 sub-layers), DecoderLayer (3)."""

from __future__ import annotations

from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from .attention import KVCache, MultiHeadAttention
from .config import ModelConfig
from .linear import linear
from .packing import Rows
from .positions import RelativePositionBias, RotaryEmbedding
from .trace import Trace, join


class FeedForward(nn.Module):
    """FFN(x) = ReLU(x W_1 + b_1) W_2 + b_2, the same weights at every position, each row alone."""

    def __init__(self, d_model: int, d_ff: int, bias: bool = True) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w_2 = nn.Linear(d_ff, d_model, bias=bias)
        nn.init.xavier_uniform_(self.w_1.weight)
        nn.init.xavier_uniform_(self.w_2.weight)

    def forward(self, x: Tensor, trace: Trace | None = None, prefix: str = "") -> Tensor:
        hidden = F.relu(linear(x, self.w_1.weight, self.w_1.bias), inplace=True)   # (batch, len, d_ff)
        out = linear(hidden, self.w_2.weight, self.w_2.bias)                 # (batch, len, d)
        if trace is not None:
            trace.record(join(prefix, "hidden"), hidden)
            trace.record(join(prefix, "output"), out)
        return out


class ResidualNorm(nn.Module):
    """One sub-layer's residual path and LayerNorm.

    post (2017): LN(x + Dropout(Sub(x)))      pre: x + Dropout(Sub(LN(x)))
    LayerNorm works over the d features of each position alone.
    """

    def __init__(self, d_model: int, eps: float, placement: str, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.placement = placement
        self.dropout = nn.Dropout(dropout)

    def _drop(self, x: Tensor) -> Tensor:
        """Dropout in training; in eval it is the identity, so skip the module call (decoding steps)."""
        return self.dropout(x) if self.training else x

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor], trace: Trace | None = None,
                prefix: str = "") -> Tensor:
        if self.placement == "post":
            residual = x + self._drop(sublayer(x))                           # (batch, len, d)
            normed = out = self.norm(residual)
        else:
            normed = self.norm(x)
            residual = out = x + self._drop(sublayer(normed))
        if trace is not None:
            trace.record(join(prefix, "input"), x)
            trace.record(join(prefix, "residual"), residual)
            trace.record(join(prefix, "normed"), normed)
        return out

    def step(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """`forward` for one decoding step in eval mode (no dropout, no trace), without module-call overhead."""
        n = self.norm
        if self.placement == "post":                                         # the sum goes into the fresh output
            return F.layer_norm(sublayer(x).add_(x), n.normalized_shape, n.weight, n.bias, n.eps)
        return sublayer(F.layer_norm(x, n.normalized_shape, n.weight, n.bias, n.eps)).add_(x)


def _attention(cfg: ModelConfig, self_attention: bool) -> MultiHeadAttention:
    rope = RotaryEmbedding(cfg.d_k, cfg.rope_base) if self_attention and cfg.positions == "rope" else None
    relative = (RelativePositionBias(cfg.heads, cfg.relative_clip)
                if self_attention and cfg.positions == "relative" else None)
    return MultiHeadAttention(cfg.d_model, cfg.heads, cfg.d_k, cfg.d_v, bias=cfg.bias,
                              dropout=cfg.attention_dropout, scale=cfg.scale_scores, rope=rope,
                              relative=relative, path=cfg.attention_path)


class EncoderLayer(nn.Module):
    """Self-attention over all (non-PAD) source positions, then FFN; each with residual + norm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attention = _attention(cfg, self_attention=True)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.bias)
        self.sublayer = nn.ModuleList(
            ResidualNorm(cfg.d_model, cfg.eps, cfg.norm, cfg.dropout) for _ in range(2))

    def forward(self, x: Tensor, mask: Tensor | None = None, *, causal: bool = False,
                trace: Trace | None = None, prefix: str = "", rows: Rows | None = None) -> Tensor:
        """x: (batch, src, d), or (n, d) real rows with `rows`; mask True = may attend (key padding, or any
        visibility table)."""
        sa = join(prefix, "self_attention")
        x = self.sublayer[0](
            x, lambda h: self.self_attention(h, mask=mask, causal=causal, trace=trace, prefix=sa, rows=rows),
            trace, join(prefix, "sublayer.0"))
        x = self.sublayer[1](x, lambda h: self.ffn(h, trace, join(prefix, "ffn")), trace,
                             join(prefix, "sublayer.1"))
        if trace is not None:
            trace.record(join(prefix, "output"), x)
        return x


class LayerCache:
    """The KV caches of one decoder layer: self-attention grows, cross-attention is static."""

    def __init__(self) -> None:
        self.self = KVCache()
        self.cross = KVCache(static=True)

    def reorder(self, index: Tensor) -> None:
        self.self.reorder(index)
        self.cross.reorder(index)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder output H, FFN; each with residual + norm.

    With `cross=False` it is the two-sub-layer causal block of a decoder-only model.
    """

    def __init__(self, cfg: ModelConfig, cross: bool = True) -> None:
        super().__init__()
        self.self_attention = _attention(cfg, self_attention=True)
        self.cross_attention = _attention(cfg, self_attention=False) if cross else None
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.bias)
        n = 3 if cross else 2
        self.sublayer = nn.ModuleList(
            ResidualNorm(cfg.d_model, cfg.eps, cfg.norm, cfg.dropout) for _ in range(n))

    def forward(self, y: Tensor, memory: Tensor | None = None, self_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, *, causal: bool = True, cache: LayerCache | None = None,
                trace: Trace | None = None, prefix: str = "", rows: Rows | None = None,
                memory_rows: Rows | None = None) -> Tensor:
        """y: (batch, tgt, d); memory: (batch, src, d); masks True = may attend.

        rows / memory_rows: y / memory come packed as real rows only, (n, d) (training)."""
        self_cache = cache.self if cache is not None else None
        y = self.sublayer[0](
            y, lambda h: self.self_attention(h, mask=self_mask, causal=causal, cache=self_cache, trace=trace,
                                             prefix=join(prefix, "self_attention"), rows=rows),
            trace, join(prefix, "sublayer.0"))
        s = 1
        if self.cross_attention is not None:
            if memory is None:
                raise ValueError("DecoderLayer with cross-attention needs the encoder output (memory)")
            cross_cache = cache.cross if cache is not None else None
            y = self.sublayer[1](
                y, lambda h: self.cross_attention(h, memory, mask=memory_mask, cache=cross_cache, trace=trace,
                                                  prefix=join(prefix, "cross_attention"), rows=rows,
                                                  memory_rows=memory_rows),
                trace, join(prefix, "sublayer.1"))
            s = 2
        y = self.sublayer[s](y, lambda h: self.ffn(h, trace, join(prefix, "ffn")), trace,
                             join(prefix, f"sublayer.{s}"))
        if trace is not None:
            trace.record(join(prefix, "output"), y)
        return y

    def step(self, y: Tensor, cache: LayerCache, memory: Tensor | None = None, memory_mask: Tensor | None = None,
             memory_keep: Tensor | None = None) -> Tensor:
        """One decoding step in eval mode: y (batch, d) is each row's newest position -> (batch, d).

        The same sub-layers as `forward` with the cache, for one query row (MultiHeadAttention.step).
        memory_mask / memory_keep: the source visibility, prepared once per source (DecoderCache).
        """
        y = self.sublayer[0].step(y, lambda h: self.self_attention.step(h, cache.self))
        s = 1
        if self.cross_attention is not None:
            if memory is None:
                raise ValueError("DecoderLayer with cross-attention needs the encoder output (memory)")
            y = self.sublayer[1].step(y, lambda h: self.cross_attention.step(h, cache.cross, memory, memory_mask,
                                                                             memory_keep))
            s = 2
        return self.sublayer[s].step(y, self.ffn)
