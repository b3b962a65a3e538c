"""MultiHeadAttention (self and cross) with a KV cache, a fast path and a glass path.

Fast path: fused projections + `F.scaled_dot_product_attention`. Glass path: the same math
written out (QK^T, / sqrt(d_k), mask, softmax over keys, . V, concat, W^O), recording every
intermediate per head. Tests hold the two equal.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .linear import linear
from .masks import as_attention_mask, causal_mask, combine
from .packing import Rows
from .positions import RelativePositionBias, RotaryEmbedding
from .trace import Trace, join


class KVCache:
    """Keys and values of one attention module across decoding steps.

    Self-attention: one row per step is appended (buffer grows by doubling, no re-concatenation).
    Cross-attention (`static=True`): K/V are projected from the encoder output once per source.
    """

    def __init__(self, static: bool = False) -> None:
        self.static = static
        self.k: Tensor | None = None    # (batch, heads, capacity, d_k)
        self.v: Tensor | None = None    # (batch, heads, capacity, d_v)
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add new rows (batch, heads, new, d) and return every cached row so far."""
        new = k.size(2)
        need = self.length + new
        if self.k is None or need > self.k.size(2):
            cap = max(16, need, 2 * (self.k.size(2) if self.k is not None else 0))
            k_buf = k.new_empty(k.size(0), k.size(1), cap, k.size(3))
            v_buf = v.new_empty(v.size(0), v.size(1), cap, v.size(3))
            if self.k is not None:
                k_buf[:, :, : self.length] = self.k[:, :, : self.length]
                v_buf[:, :, : self.length] = self.v[:, :, : self.length]
            self.k, self.v = k_buf, v_buf
        self.k.narrow(2, self.length, new).copy_(k)
        self.v.narrow(2, self.length, new).copy_(v)
        self.length = need
        return self.k.narrow(2, 0, need), self.v.narrow(2, 0, need)

    def set_static(self, k: Tensor, v: Tensor) -> None:
        self.k, self.v, self.length = k, v, k.size(2)

    def get(self) -> tuple[Tensor, Tensor]:
        if self.static:                                                      # K/V hold exactly the source rows
            return self.k, self.v
        return self.k.narrow(2, 0, self.length), self.v.narrow(2, 0, self.length)

    @property
    def ready(self) -> bool:
        return self.k is not None

    def reorder(self, index: Tensor) -> None:
        """Follow the beams: keep batch rows `index` (beam search reordering)."""
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


def guard_empty_rows(mask: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """Rows with no visible key: let them see everything (finite softmax), return a row-keep flag.

    The caller multiplies weights/outputs by the flag, so such rows give zero weights and zero
    output, never NaN, in every dtype, and their gradients stay finite.
    """
    if mask is None:
        return None, None
    has_key = mask.any(dim=-1, keepdim=True)                                 # (..., query, 1)
    if bool(has_key.all()):
        return mask, None
    return mask | ~has_key, has_key


class MultiHeadAttention(nn.Module):
    """H heads, each softmax(Q_r K_r^T / sqrt(d_k) + M) V_r; Concat(H_1..H_H) W^O.

    Per-head projections are stored fused: `in_proj` rows are [W^Q heads | W^K heads | W^V heads]
    (the layout of nn.MultiheadAttention), `out_proj` is W^O. Self-attention projects all three
    from x in one matmul; cross-attention projects Q from x and K/V from the encoder output.
    """

    def __init__(self, d_model: int, heads: int, d_k: int, d_v: int, *, bias: bool = True,
                 dropout: float = 0.0, scale: bool = True, rope: RotaryEmbedding | None = None,
                 relative: RelativePositionBias | None = None, path: str = "fast") -> None:
        super().__init__()
        self.d_model, self.heads, self.d_k, self.d_v = d_model, heads, d_k, d_v
        self.in_proj = nn.Linear(d_model, heads * (2 * d_k + d_v), bias=bias)
        self.out_proj = nn.Linear(heads * d_v, d_model, bias=bias)
        self.dropout = dropout
        self.scale = scale
        self.rope = rope
        self.relative = relative
        self.path = path
        self.disabled_heads: set[int] = set()
        nn.init.xavier_uniform_(self.in_proj.weight)
        nn.init.xavier_uniform_(self.out_proj.weight)
        if bias:
            nn.init.zeros_(self.in_proj.bias)
            nn.init.zeros_(self.out_proj.bias)

    # ---- projections ---------------------------------------------------------------------
    def _split_heads(self, x: Tensor, width: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, width).transpose(1, 2)              # (batch, heads, len, width)

    def project_q(self, x: Tensor, rows: Rows | None = None) -> Tensor:
        """Q per head (batch, heads, len, d_k); x packed as (n, d) when `rows` says where its rows sit."""
        n = self.heads * self.d_k
        q = linear(x, self.in_proj.weight, self.in_proj.bias, slice(0, n))
        return self._split_heads(q if rows is None else rows.unpack(q), self.d_k)

    def project_kv(self, x: Tensor, rows: Rows | None = None) -> tuple[Tensor, Tensor]:
        n = self.heads * self.d_k
        kv = linear(x, self.in_proj.weight, self.in_proj.bias, slice(n, None))  # (batch, len, H*(d_k+d_v))
        if rows is not None:
            kv = rows.unpack(kv)                                             # (n, .) -> (batch, len, .)
        k, v = kv.split((n, self.heads * self.d_v), dim=-1)
        return self._split_heads(k, self.d_k), self._split_heads(v, self.d_v)

    def project_qkv(self, x: Tensor, rows: Rows | None = None) -> tuple[Tensor, Tensor, Tensor]:
        n = self.heads * self.d_k
        qkv = linear(x, self.in_proj.weight, self.in_proj.bias)              # (batch, len, H*(2d_k+d_v))
        if rows is not None:
            qkv = rows.unpack(qkv)                                           # (n, .) -> (batch, len, .)
        q, k, v = qkv.split((n, n, self.heads * self.d_v), dim=-1)
        return self._split_heads(q, self.d_k), self._split_heads(k, self.d_k), self._split_heads(v, self.d_v)

    # ---- forward -------------------------------------------------------------------------
    def forward(self, x: Tensor, memory: Tensor | None = None, mask: Tensor | None = None, *,
                causal: bool = False, cache: KVCache | None = None, trace: Trace | None = None,
                prefix: str = "", rows: Rows | None = None, memory_rows: Rows | None = None) -> Tensor:
        """x: (batch, query, d) queries. memory: (batch, key, d) for cross-attention, None for self.

        mask: boolean, broadcastable to (batch, heads, query, key), True = may attend.
        causal: add the triangle, aligned to the cache (query i is position offset + i).
        cache: KVCache to extend (self) or to fill once and reuse (cross).
        rows / memory_rows: x / memory come packed, (n, d) real rows only (training); so does the output.
        """
        offset = 0
        if memory is None:                                                   # self-attention
            q, k, v = self.project_qkv(x, rows)                              # (batch, heads, len, d_k|d_v)
            if cache is not None:
                offset = cache.length
            q_pos = None                                                     # positions, only if used
            if self.rope is not None or self.relative is not None:
                q_pos = torch.arange(offset, offset + q.size(2), device=x.device)
            if self.rope is not None:
                q, k = self.rope(q, q_pos), self.rope(k, q_pos)
            if cache is not None:
                k, v = cache.append(k, v)                                    # (batch, heads, offset+len, d)
        else:                                                                # cross-attention
            q = self.project_q(x, rows)
            if cache is not None and cache.ready:
                k, v = cache.get()
            else:
                k, v = self.project_kv(memory, memory_rows)
                if cache is not None:
                    cache.set_static(k, v)
            q_pos = None
        n_q, n_k = q.size(2), k.size(2)

        mask = as_attention_mask(mask)
        is_causal = False
        if causal and n_q > 1:
            if mask is None and offset == 0 and n_q == n_k and self.relative is None:
                is_causal = True                                             # SDPA's top-left triangle is right here
            else:
                mask = as_attention_mask(combine(causal_mask(n_q, n_k, offset, device=x.device), mask))
        bias = None
        if self.relative is not None and memory is None:
            k_pos = torch.arange(n_k, device=x.device)
            bias = self.relative(q_pos, k_pos).to(q.dtype)                   # (heads, query, key)

        glass = self.path == "glass" or trace is not None
        if glass:
            if is_causal:
                mask = as_attention_mask(causal_mask(n_q, n_k, 0, device=x.device))
            heads_out = self._glass(q, k, v, mask, bias, trace, prefix)
        else:
            heads_out = self._fast(q, k, v, mask, bias, is_causal)
        if self.disabled_heads:
            heads_out = heads_out * self._head_keep(heads_out)               # a switched-off head adds zeros
        b = q.size(0)
        concat = heads_out.transpose(1, 2).reshape(b, n_q, self.heads * self.d_v)  # (batch, query, H*d_v)
        if rows is not None:
            concat = rows.pack(concat)                                       # (n, H*d_v): real rows only
        out = linear(concat, self.out_proj.weight, self.out_proj.bias)       # (batch, query, d)
        if trace is not None:
            trace.record(join(prefix, "concat"), concat)
            trace.record(join(prefix, "output"), out)
        return out

    def step(self, x: Tensor, cache: KVCache, memory: Tensor | None = None, mask: Tensor | None = None,
             keep: Tensor | None = None) -> Tensor:
        """One decoding step on the fast path: x (batch, d) is the newest position of each row -> (batch, d).

        The same numbers as `forward` with the cache, in fewer operations: self-attention appends its K/V
        row and its one query sees every cached row (nothing later exists yet, so no triangle); cross-
        attention projects memory's K/V on the first step only. mask: (batch, 1, 1, key) visibility with
        no empty row (see `guard_empty_rows`); keep: (batch, 1, 1, 1) zero for rows that had none.
        """
        b, h, d_k, d_v = x.size(0), self.heads, self.d_k, self.d_v
        in_proj, bias = self.in_proj, None
        if memory is None:                                                   # self-attention
            qkv = linear(x, in_proj.weight, in_proj.bias)                    # (batch, H*(2d_k+d_v))
            if d_k == d_v:
                q, k, v = qkv.view(b, 3, h, 1, d_k).unbind(1)                # 3 x (batch, heads, 1, d_k)
            else:
                q, k, v = qkv.split((h * d_k, h * d_k, h * d_v), dim=1)
                q, k, v = q.view(b, h, 1, d_k), k.view(b, h, 1, d_k), v.view(b, h, 1, d_v)
            if self.rope is not None or self.relative is not None:
                pos = torch.tensor([cache.length], device=x.device)          # this row's position
                if self.rope is not None:
                    q, k = self.rope(q, pos), self.rope(k, pos)
                if self.relative is not None:
                    bias = self.relative(pos, torch.arange(cache.length + 1, device=x.device)).to(q.dtype)
            k, v = cache.append(k, v)                                        # (batch, heads, key, d)
        else:                                                                # cross-attention
            q = linear(x, in_proj.weight, in_proj.bias, slice(0, h * d_k)).view(b, h, 1, d_k)
            if not cache.ready:
                cache.set_static(*self.project_kv(memory))
            k, v = cache.get()                                               # (batch, heads, src, d)
        if self.path == "glass":
            out = self._glass(q, k, v, mask, bias, None, "")                 # (batch, heads, 1, d_v)
        else:
            out = self._fast(q, k, v, mask, bias, False, guarded=True)
        if keep is not None:
            out = out * keep
        if self.disabled_heads:
            out = out * self._head_keep(out)
        out_proj = self.out_proj
        return linear(out.reshape(b, h * d_v), out_proj.weight, out_proj.bias)   # (batch, d)

    def _head_keep(self, heads_out: Tensor) -> Tensor:
        """(heads, 1, 1): 0 for a switched-off head, 1 for the others."""
        keep = torch.ones(self.heads, 1, 1, dtype=heads_out.dtype, device=heads_out.device)
        keep[sorted(self.disabled_heads)] = 0.0
        return keep

    def _fast(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
              is_causal: bool, guarded: bool = False) -> Tensor:
        """SDPA with glassformer's mask; `guarded`: the caller already handled rows with no visible key."""
        mask, has_key = (mask, None) if guarded else guard_empty_rows(mask)
        attn_mask = mask
        if bias is not None:
            attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        scale = 1.0 / math.sqrt(self.d_k) if self.scale else 1.0
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0, scale=scale)   # (batch, heads, query, d_v)
        if has_key is not None:
            out = out * has_key
        return out

    def _glass(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
               trace: Trace | None, prefix: str) -> Tensor:
        scores = q @ k.transpose(-2, -1)                                     # (batch, heads, query, key)
        scaled = scores / math.sqrt(self.d_k) if self.scale else scores
        if bias is not None:
            scaled = scaled + bias
        visible = mask
        if visible is not None:
            scaled = scaled.masked_fill(~visible, float("-inf"))             # masked entries: -inf
        _, has_key = guard_empty_rows(visible)                             # rows with no visible key
        logits = scaled if has_key is None else scaled.masked_fill(~has_key, 0.0)
        weights = torch.softmax(logits, dim=-1)                              # softmax over keys
        if has_key is not None:
            weights = weights * has_key
        if self.training and self.dropout > 0:
            weights = F.dropout(weights, self.dropout)
        out = weights @ v                                                    # (batch, heads, query, d_v)
        if trace is not None:
            for h in range(self.heads):
                head = join(prefix, f"head.{h}")
                trace.record(f"{head}.q", q[:, h])
                trace.record(f"{head}.k", k[:, h])
                trace.record(f"{head}.v", v[:, h])
                trace.record(f"{head}.scores", scores[:, h])
                trace.record(f"{head}.scaled_scores", scaled[:, h])
                trace.record(f"{head}.weights", weights[:, h])
                trace.record(f"{head}.output", out[:, h])
            if visible is not None:
                trace.record(join(prefix, "mask"), visible.expand(q.size(0), -1, q.size(2), k.size(2))[:, 0])
        return out
