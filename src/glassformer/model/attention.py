"""Multi-head attention, as the lesson writes it.

    Q = X W^Q        K = X W^K        V = X W^V          (cross-attention: K = H W^K, V = H W^V)
    head_r = softmax(Q_r K_r^T / sqrt(d_k) + b + M) V_r   softmax over the keys; M = -inf where masked
    MultiHead(X) = Concat(head_1, ..., head_H) W^O

`attend_math` is that formula with every intermediate passing a hook point (`head.{r}.scores`,
`.weights`, ...); `attend_sdpa` gives the same numbers from PyTorch's fused
`scaled_dot_product_attention`. One `if` in `MultiHeadAttention.attend` picks between them: the math
when the config asks for it (`attention_path="glass"`) or a per-head hook point has something attached,
else SDPA. Tests hold the two equal to 1e-5 in fp32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cache import KVCache
from .hooks import HookPoint
from .masks import as_attention_mask, causal_mask, combine
from .positions import RelativePositionBias, RotaryEmbedding


def attend_math(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, bias: Tensor | None = None, *,
                scale: bool = True, dropout: float = 0.0, heads: nn.ModuleList | None = None,
                guard: bool = True) -> Tensor:
    """The formula written out. q (batch, heads, query, d_k), k (.., key, d_k), v (.., key, d_v);
    mask (batch|1, 1|heads, query, key) True = may attend; bias (heads, query, key). -> (batch, heads, query, d_v).

    A query row with no visible key gets zero weights and zero output (never NaN); `guard=False`: the
    caller knows every row sees a key (a KV cache's row sees its own)."""
    hook = (lambda part, x: _per_head(heads, part, x)) if heads is not None else (lambda part, x: x)
    q, k, v = hook("q", q), hook("k", k), hook("v", v)
    scores = hook("scores", q @ k.transpose(-2, -1))                         # (batch, heads, query, key)
    scaled = scores / math.sqrt(q.size(-1)) if scale else scores
    if bias is not None:
        scaled = scaled + bias                                               # relative bias b_{i-j}
    if mask is not None:
        scaled = scaled.masked_fill(~mask, float("-inf"))                   # masked entries: -inf
    scaled = hook("scaled_scores", scaled)
    _, has_key = guard_empty_rows(mask) if guard else (mask, None)          # rows with no visible key
    logits = scaled if has_key is None else scaled.masked_fill(~has_key, 0.0)
    weights = torch.softmax(logits, dim=-1)                                  # softmax over keys
    if has_key is not None:
        weights = weights * has_key
    if dropout > 0:
        weights = F.dropout(weights, dropout)
    weights = hook("weights", weights)
    return hook("output", weights @ v)                                       # (batch, heads, query, d_v)


def attend_sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, bias: Tensor | None = None, *,
                scale: bool = True, dropout: float = 0.0, guard: bool = True) -> Tensor:
    """The same result from `F.scaled_dot_product_attention` (no per-head hook points)."""
    mask, has_key = guard_empty_rows(mask) if guard else (mask, None)
    attn_mask = mask
    if bias is not None:
        attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout,
        scale=1.0 / math.sqrt(q.size(-1)) if scale else 1.0)                # (batch, heads, query, d_v)
    return out if has_key is None else out * has_key


def guard_empty_rows(mask: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """Rows with no visible key: let them see everything (finite softmax), return a row-keep flag.

    The caller multiplies weights/outputs by the flag, so such rows give zero weights and zero
    output, never NaN, in every dtype, and their gradients stay finite. Eagerly, a mask with no empty row
    skips the flag (one host sync); under torch.compile the flag is always applied (the same numbers: it is
    all ones then), so the graph has no data-dependent branch.
    """
    if mask is None:
        return None, None
    has_key = mask.any(dim=-1, keepdim=True)                                 # (..., query, 1)
    if not torch.compiler.is_compiling() and bool(has_key.all()):
        return mask, None
    return mask | ~has_key, has_key


HEAD_PROBES = ("q", "k", "v", "scores", "scaled_scores", "weights", "output")


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


class MultiHeadAttention(nn.Module):
    """What self- and cross-attention share: W^Q, W^K, W^V, W^O, H heads on attend(), Concat(heads) W^O.

    W^Q, W^K, W^V hold all heads side by side ((out, in) = (H*d_k, d) as nn.Linear stores them; head r
    is rows r*d_k:(r+1)*d_k), laid out alike in self- and cross-attention.
    Hook points: `head.{r}.{q,k,v,scores,scaled_scores,weights,output}` (math backend),
    `mask` (batch, query, key) visibility when something is masked, `concat`, `output`.
    """

    def __init__(self, d_model: int, heads: int, d_k: int, d_v: int, *, bias: bool = True,
                 dropout: float = 0.0, scale: bool = True, path: str = "fast") -> None:
        super().__init__()
        self.d_model, self.heads, self.d_k, self.d_v = d_model, heads, d_k, d_v
        self.dropout, self.scale, self.path = dropout, scale, path
        self.w_q = nn.Linear(d_model, heads * d_k, bias=bias)               # Q = X W^Q
        self.w_k = nn.Linear(d_model, heads * d_k, bias=bias)               # K = X W^K
        self.w_v = nn.Linear(d_model, heads * d_v, bias=bias)               # V = X W^V
        self.w_o = nn.Linear(heads * d_v, d_model, bias=bias)               # Concat(heads) W^O
        # Glorot-uniform; W^Q, W^K, W^V with gain 1/sqrt(2), the bound of one [W^Q | W^K | W^V] (fairseq)
        for lin, gain in ((self.w_q, 0.5 ** 0.5), (self.w_k, 0.5 ** 0.5), (self.w_v, 0.5 ** 0.5), (self.w_o, 1.0)):
            nn.init.xavier_uniform_(lin.weight, gain=gain)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        self.head = nn.ModuleList(HeadProbes() for _ in range(heads))
        self.mask = HookPoint()
        self.concat = HookPoint()
        self.output = HookPoint()
        self._head_hooks = False

    def split_heads(self, x: Tensor, width: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, width).transpose(1, 2)              # (batch, heads, len, width)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
               guard: bool = True) -> Tensor:
        """softmax(q k^T / sqrt(d_k) + bias, masked) v per head -> (batch, heads, query, d_v); `guard`: a row
        may see no key (False: every row sees one, no check)."""
        mask = as_attention_mask(mask)
        if mask is not None and self.mask.fns:
            b, n_q, n_k = q.size(0), q.size(2), k.size(2)
            mask = self.mask(mask.expand(b, -1, n_q, n_k)[:, 0])[:, None]     # (batch, query, key) probe
        dropout = self.dropout if self.training else 0.0
        if self.path == "glass" or self._head_hooks:
            return attend_math(q, k, v, mask, bias, scale=self.scale, dropout=dropout, heads=self.head, guard=guard)
        return attend_sdpa(q, k, v, mask, bias, scale=self.scale, dropout=dropout, guard=guard)

    def combine(self, heads_out: Tensor) -> Tensor:
        """(batch, heads, query, d_v) -> Concat(heads) W^O: (batch, query, d)."""
        b, _, n_q, _ = heads_out.shape
        concat = heads_out.transpose(1, 2).reshape(b, n_q, self.heads * self.d_v)  # (batch, query, H*d_v)
        return self.output(self.w_o(self.concat(concat)))                   # (batch, query, d)

    def hooks_changed(self) -> None:
        """Called when hooks are attached or removed: per-head hooks need the math backend."""
        self._head_hooks = any(p.fns for h in self.head for p in h.children())


class SelfAttention(MultiHeadAttention):
    """Queries, keys and values from the same rows X: Q = X W^Q, K = X W^K, V = X W^V.
    Positions: RoPE rotates q and k, a relative bias joins the scores."""

    def __init__(self, d_model: int, heads: int, d_k: int, d_v: int, *, bias: bool = True, dropout: float = 0.0,
                 scale: bool = True, rope: RotaryEmbedding | None = None,
                 relative: RelativePositionBias | None = None, path: str = "fast") -> None:
        super().__init__(d_model, heads, d_k, d_v, bias=bias, dropout=dropout, scale=scale, path=path)
        self.rope = rope
        self.relative = relative

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K, V per head: (batch, heads, len, d_k | d_k | d_v)."""
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)                      # (batch, len, H*d_k | H*d_v)
        return self.split_heads(q, self.d_k), self.split_heads(k, self.d_k), self.split_heads(v, self.d_v)

    def forward(self, x: Tensor, mask: Tensor | None = None, *, causal: bool = False,
                cache: KVCache | None = None) -> Tensor:
        """x: (batch, query, d). mask: broadcastable to (batch, heads, query, key), True = may attend.

        causal: add the triangle (with a cache, every row sees the cached keys up to its own position).
        cache: the K/V rows of earlier steps; this call's rows are written at their positions after them
        (incremental decoding), and the queries read the cache's whole buffer through its mask.
        """
        q, k, v = self.project(x)                                            # (batch, heads, len, d_k|d_v)
        positions = None
        if cache is not None:
            positions = cache.start(q.size(2), q.device)                     # (len,) absolute positions
        elif self.rope is not None or self.relative is not None:
            positions = torch.arange(q.size(2), device=q.device)
        if self.rope is not None:
            q, k = self.rope(q, positions), self.rope(k, positions)
        guard = True
        if cache is not None:
            k, v, visible = cache.update(self, k, v)                         # (batch, heads, positions, d)
            guard = mask is not None                                         # each row sees its own key
            mask = combine(visible, as_attention_mask(mask))                 # (query, positions) and mask
        elif causal and q.size(2) > 1:                                       # one query row sees every key
            mask = combine(causal_mask(q.size(2), k.size(2), device=q.device), as_attention_mask(mask))
        bias = None
        if self.relative is not None:
            bias = self.relative(positions, torch.arange(k.size(2), device=q.device)).to(q.dtype)  # (H, q, k)
        return self.combine(self.attend(q, k, v, mask, bias, guard))


class CrossAttention(MultiHeadAttention):
    """Queries from the decoder rows X, keys and values from the encoder output H (`memory`):
    Q = X W^Q, K = H W^K, V = H W^V."""

    def project_q(self, x: Tensor) -> Tensor:
        """Q per head (batch, heads, len, d_k)."""
        return self.split_heads(self.w_q(x), self.d_k)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """K, V per head from the encoder output: (batch, heads, src, d_k), (batch, heads, src, d_v)."""
        return self.split_heads(self.w_k(memory), self.d_k), self.split_heads(self.w_v(memory), self.d_v)

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor | None = None, *,
                cache: KVCache | None = None) -> Tensor:
        """x: (batch, query, d); memory H: (batch, src, d); mask True = may attend (source padding).

        cache: K/V of `memory`, projected on the first decoding step and reused by the later ones."""
        q = self.project_q(x)                                                # (batch, heads, query, d_k)
        kv = cache.cross.get(self) if cache is not None else None
        if kv is None:
            if memory is None:
                raise ValueError("cross-attention needs the encoder output (memory)")
            kv = self.project_kv(memory)                                     # (batch, heads, src, d_k|d_v)
            if cache is not None:
                cache.cross[self] = kv
        return self.combine(self.attend(q, *kv, mask, None))
