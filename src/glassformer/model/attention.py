"""Multi-head attention: SelfAttention and CrossAttention on one core, attend(q, k, v, mask, bias).

    head_r = softmax(Q_r K_r^T / sqrt(d_k) + b + M) V_r        MultiHead = Concat(head_1..head_H) W^O

Two backends compute `attend`: the math backend writes the formula out and passes every
intermediate of every head through a hook point (`head.{r}.scores`, `.weights`, ...); the SDPA
backend is PyTorch's fused `scaled_dot_product_attention`. The math backend runs when the config
asks for it (`attention_path="glass"`) or when a per-head hook point has something attached;
tests hold the two equal to 1e-5 in fp32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .hooks import HookPoint
from .masks import as_attention_mask, causal_mask, combine
from .packing import Rows
from .positions import RelativePositionBias, RotaryEmbedding

HEAD_PROBES = ("q", "k", "v", "scores", "scaled_scores", "weights", "output")


class KVCache:
    """Keys and values of one attention module across decoding steps (the plain, growing cache).

    Self-attention: each step appends its rows (the buffer grows by doubling, no re-concatenation).
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


class HeadProbes(nn.Module):
    """The hook points of one head: q, k, v, scores, scaled_scores, weights, output."""

    def __init__(self) -> None:
        super().__init__()
        for name in HEAD_PROBES:
            self.add_module(name, HookPoint())


def _per_head(heads: nn.ModuleList, part: str, x: Tensor) -> Tensor:
    """x: (batch, heads, ...) through each head's hook point `part`; untouched when none is attached."""
    points = [getattr(h, part) for h in heads]
    if not any(p.fns for p in points):
        return x
    return torch.stack([p(x[:, r]) for r, p in enumerate(points)], dim=1)   # (batch, heads, ...)


def attend_math(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, bias: Tensor | None = None, *,
                scale: bool = True, dropout: float = 0.0, heads: nn.ModuleList | None = None) -> Tensor:
    """The formula written out. q (batch, heads, query, d_k), k (.., key, d_k), v (.., key, d_v);
    mask (batch|1, 1|heads, query, key) True = may attend; bias (heads, query, key). -> (batch, heads, query, d_v).

    A query row with no visible key gets zero weights and zero output (never NaN)."""
    hook = (lambda part, x: _per_head(heads, part, x)) if heads is not None else (lambda part, x: x)
    q, k, v = hook("q", q), hook("k", k), hook("v", v)
    scores = hook("scores", q @ k.transpose(-2, -1))                         # (batch, heads, query, key)
    scaled = scores / math.sqrt(q.size(-1)) if scale else scores
    if bias is not None:
        scaled = scaled + bias                                               # relative bias b_{i-j}
    if mask is not None:
        scaled = scaled.masked_fill(~mask, float("-inf"))                   # masked entries: -inf
    scaled = hook("scaled_scores", scaled)
    _, has_key = guard_empty_rows(mask)                                      # rows with no visible key
    logits = scaled if has_key is None else scaled.masked_fill(~has_key, 0.0)
    weights = torch.softmax(logits, dim=-1)                                  # softmax over keys
    if has_key is not None:
        weights = weights * has_key
    if dropout > 0:
        weights = F.dropout(weights, dropout)
    weights = hook("weights", weights)
    return hook("output", weights @ v)                                       # (batch, heads, query, d_v)


def attend_sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, bias: Tensor | None = None, *,
                scale: bool = True, dropout: float = 0.0, is_causal: bool = False) -> Tensor:
    """The same result from `F.scaled_dot_product_attention` (is_causal: top-left triangle, no cache only)."""
    mask, has_key = guard_empty_rows(mask)
    attn_mask = mask
    if bias is not None:
        attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout,
        scale=1.0 / math.sqrt(q.size(-1)) if scale else 1.0)                # (batch, heads, query, d_v)
    return out if has_key is None else out * has_key


class MultiHeadAttention(nn.Module):
    """What self- and cross-attention share: H heads on attend(), then Concat(heads) W^O.

    Hook points: `head.{r}.{q,k,v,scores,scaled_scores,weights,output}` (math backend),
    `mask` (batch, query, key) visibility when something is masked, `concat`, `output`.
    """

    def __init__(self, d_model: int, heads: int, d_k: int, d_v: int, *, bias: bool = True,
                 dropout: float = 0.0, scale: bool = True, path: str = "fast") -> None:
        super().__init__()
        self.d_model, self.heads, self.d_k, self.d_v = d_model, heads, d_k, d_v
        self.dropout, self.scale, self.path = dropout, scale, path
        self.head = nn.ModuleList(HeadProbes() for _ in range(heads))
        self.mask = HookPoint()
        self.concat = HookPoint()
        self.output = HookPoint()
        self._head_hooks = False

    def _projections(self, bias: bool) -> None:
        """W^Q, W^K, W^V (all heads side by side, (d, H*d_k) as x W) and W^O, laid out alike in self- and
        cross-attention. Glorot-uniform; W^Q, W^K, W^V with gain 1/sqrt(2), the bound of one fused
        [W^Q | W^K | W^V] matrix (as fairseq draws them)."""
        d, h = self.d_model, self.heads
        self.w_q = nn.Linear(d, h * self.d_k, bias=bias)                    # Q = x W^Q
        self.w_k = nn.Linear(d, h * self.d_k, bias=bias)                    # K = x W^K
        self.w_v = nn.Linear(d, h * self.d_v, bias=bias)                    # V = x W^V
        self.w_o = nn.Linear(h * self.d_v, d, bias=bias)                    # Concat(heads) W^O
        for lin, gain in ((self.w_q, 0.5 ** 0.5), (self.w_k, 0.5 ** 0.5), (self.w_v, 0.5 ** 0.5), (self.w_o, 1.0)):
            nn.init.xavier_uniform_(lin.weight, gain=gain)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def hooks_changed(self) -> None:
        """Called when hooks are attached or removed: per-head hooks need the math backend."""
        self._head_hooks = any(p.fns for h in self.head for p in h.children())

    def split_heads(self, x: Tensor, width: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, width).transpose(1, 2)              # (batch, heads, len, width)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
               causal_offset: int | None = None) -> Tensor:
        """softmax(q k^T / sqrt(d_k) + bias, masked) v per head -> (batch, heads, query, d_v).

        causal_offset: add the triangle for queries at positions offset.. (None: no triangle)."""
        b, n_q, n_k = q.size(0), q.size(2), k.size(2)
        mask = as_attention_mask(mask)
        is_causal = False
        if causal_offset is not None and n_q > 1:
            if mask is None and causal_offset == 0 and n_q == n_k and bias is None:
                is_causal = True                                             # SDPA's top-left triangle is right
            else:
                mask = as_attention_mask(combine(causal_mask(n_q, n_k, causal_offset, device=q.device), mask))
        math_backend = self.path == "glass" or self._head_hooks
        if is_causal and (math_backend or self.mask.fns):
            mask, is_causal = as_attention_mask(causal_mask(n_q, n_k, device=q.device)), False
        if mask is not None and self.mask.fns:
            mask = self.mask(mask.expand(b, -1, n_q, n_k)[:, 0])[:, None]     # (batch, query, key) probe
        dropout = self.dropout if self.training else 0.0
        if math_backend:
            return attend_math(q, k, v, mask, bias, scale=self.scale, dropout=dropout, heads=self.head)
        return attend_sdpa(q, k, v, mask, bias, scale=self.scale, dropout=dropout, is_causal=is_causal)

    def combine(self, heads_out: Tensor, rows: Rows | None) -> Tensor:
        """(batch, heads, query, d_v) -> Concat(heads) W^O: (batch, query, d), or (n, d) packed with `rows`."""
        b, _, n_q, _ = heads_out.shape
        concat = heads_out.transpose(1, 2).reshape(b, n_q, self.heads * self.d_v)  # (batch, query, H*d_v)
        if rows is not None:
            concat = rows.pack(concat)                                       # (n, H*d_v): real rows only
        return self.output(self.w_o(self.concat(concat)))               # (batch, query, d)


class SelfAttention(MultiHeadAttention):
    """Queries, keys and values from the same rows x: Q = x W^Q, K = x W^K, V = x W^V.
    Positions: RoPE rotates q and k, a relative bias joins the scores."""

    def __init__(self, d_model: int, heads: int, d_k: int, d_v: int, *, bias: bool = True, dropout: float = 0.0,
                 scale: bool = True, rope: RotaryEmbedding | None = None,
                 relative: RelativePositionBias | None = None, path: str = "fast") -> None:
        super().__init__(d_model, heads, d_k, d_v, bias=bias, dropout=dropout, scale=scale, path=path)
        self._projections(bias)
        self.rope = rope
        self.relative = relative

    def project(self, x: Tensor, rows: Rows | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K, V per head: (batch, heads, len, d_k | d_k | d_v); x packed (n, d) when `rows` is given."""
        unpack = (lambda t: t) if rows is None else rows.unpack               # (n, .) -> (batch, len, .)
        q, k, v = unpack(self.w_q(x)), unpack(self.w_k(x)), unpack(self.w_v(x))  # (batch, len, H*d_k|H*d_v)
        return self.split_heads(q, self.d_k), self.split_heads(k, self.d_k), self.split_heads(v, self.d_v)

    def forward(self, x: Tensor, mask: Tensor | None = None, *, causal: bool = False,
                cache: KVCache | None = None, rows: Rows | None = None) -> Tensor:
        """x: (batch, query, d). mask: broadcastable to (batch, heads, query, key), True = may attend.

        causal: add the triangle, aligned to the cache (query i sits at position cached + i).
        cache: the rows of earlier steps; this call's K/V rows are appended (incremental decoding).
        rows: x comes packed, (n, d) real rows only (training); so does the output.
        """
        q, k, v = self.project(x, rows)                                      # (batch, heads, len, d_k|d_v)
        offset = cache.length if cache is not None else 0
        positions = None
        if self.rope is not None or self.relative is not None:
            positions = torch.arange(offset, offset + q.size(2), device=q.device)   # absolute positions
        if self.rope is not None:
            q, k = self.rope(q, positions), self.rope(k, positions)
        if cache is not None:
            k, v = cache.append(k, v)                                        # (batch, heads, offset+len, d)
        bias = None
        if self.relative is not None:
            bias = self.relative(positions, torch.arange(k.size(2), device=q.device)).to(q.dtype)  # (H, q, k)
        out = self.attend(q, k, v, mask, bias, offset if causal else None)   # (batch, heads, query, d_v)
        return self.combine(out, rows)


class CrossAttention(MultiHeadAttention):
    """Queries from the decoder rows x, keys and values from the encoder output H (`memory`):
    Q = x W^Q, K = H W^K, V = H W^V."""

    def __init__(self, d_model: int, heads: int, d_k: int, d_v: int, *, bias: bool = True,
                 dropout: float = 0.0, scale: bool = True, path: str = "fast") -> None:
        super().__init__(d_model, heads, d_k, d_v, bias=bias, dropout=dropout, scale=scale, path=path)
        self._projections(bias)

    def project_q(self, x: Tensor, rows: Rows | None = None) -> Tensor:
        """Q per head (batch, heads, len, d_k); x packed (n, d) when `rows` is given."""
        q = self.w_q(x)                                                      # (batch, len, H*d_k)
        return self.split_heads(q if rows is None else rows.unpack(q), self.d_k)

    def project_kv(self, memory: Tensor, rows: Rows | None = None) -> tuple[Tensor, Tensor]:
        """K, V per head from the encoder output: (batch, heads, src, d_k), (batch, heads, src, d_v)."""
        k, v = self.w_k(memory), self.w_v(memory)                            # (batch, src, H*d_k | H*d_v)
        if rows is not None:
            k, v = rows.unpack(k), rows.unpack(v)                            # (n, .) -> (batch, src, .)
        return self.split_heads(k, self.d_k), self.split_heads(v, self.d_v)

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor | None = None, *, cache: KVCache | None = None,
                rows: Rows | None = None, memory_rows: Rows | None = None) -> Tensor:
        """x: (batch, query, d); memory H: (batch, src, d); mask True = may attend (source padding).

        cache: K/V of `memory`, projected on the first call and reused by later decoding steps.
        rows / memory_rows: x / memory come packed, (n, d) real rows only (training)."""
        q = self.project_q(x, rows)                                          # (batch, heads, query, d_k)
        if cache is not None and cache.ready:
            k, v = cache.get()                                               # (batch, heads, src, d)
        else:
            k, v = self.project_kv(memory, memory_rows)
            if cache is not None:
                cache.set_static(k, v)
        return self.combine(self.attend(q, k, v, mask, None), rows)
