"""The decoder's weights for one static step, and the step's logits: plain torch ops over a copy of the model's
weights, so that one compiled graph (static.py, compiler.py) can run them.

    weights = DecoderStep(model)                       # [W^Q|W^K|W^V] fused per layer, wide W stored as W^T
    logits = weights.logits(tokens, pos, self_k, self_v, cross_k, cross_v, source)    # (rows, vocab)

For one query row per sentence the lesson's layer reads: x = LN(x + SelfAttention(x)), then
LN(x + CrossAttention(x, H)), then LN(x + FFN(x)) (post-norm; pre-norm puts LN inside the residual), with
attention written out (q k^T / sqrt(d_k), the mask, softmax, v). Tests hold the logits equal to the model's
`decode_step` to 1e-5 (tests/test_compiled.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model.transformer import Transformer


def _fixed(t: Tensor | None) -> nn.Parameter | None:
    """A copy of `t` as a parameter without gradient (None stays None)."""
    return None if t is None else nn.Parameter(t.detach().clone(), requires_grad=False)


class Product(nn.Module):
    """x W^T + b for x (..., in) -> (..., out). A wide W (out >= in) is kept as its contiguous W^T (in, out),
    which a product of a few rows streams about twice as fast (weights.py); a narrow one as W.
    Called as `.forward(x)`: a leaf of the step, no module dispatch."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.wide = weight.size(0) >= weight.size(1)
        self.weight = _fixed(weight.t().contiguous() if self.wide else weight)   # (in, out) or (out, in)
        self.bias = _fixed(bias)                                             # (out,) or None

    def forward(self, x: Tensor) -> Tensor:
        if not self.wide:
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, x.size(-1))                                     # (rows, in)
        out = torch.mm(rows, self.weight) if self.bias is None else torch.addmm(self.bias, rows, self.weight)
        return out.view(*x.shape[:-1], self.weight.size(1))                 # (..., out)


class Norm(nn.Module):
    """LayerNorm's gain and bias; `.forward(x)` normalises over the last dimension."""

    def __init__(self, norm: nn.LayerNorm) -> None:
        super().__init__()
        self.weight, self.bias, self.eps = _fixed(norm.weight), _fixed(norm.bias), norm.eps

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, (x.size(-1),), self.weight, self.bias, self.eps)


class LayerWeights(nn.Module):
    """One decoder layer's weights for a step: [W^Q|W^K|W^V] and W^O of self-attention, W^Q and W^O of
    cross-attention, W_1 and W_2 of the FFN, the three sub-layers' norms."""

    def __init__(self, layer) -> None:
        super().__init__()
        sa, ca, ffn = layer.self_attention, layer.cross_attention, layer.ffn
        qkv = [sa.w_q, sa.w_k, sa.w_v]
        self.qkv = Product(torch.cat([w.weight for w in qkv]),               # [W^Q | W^K | W^V] (3 H d_k, d)
                           None if sa.w_q.bias is None else torch.cat([w.bias for w in qkv]))
        self.o = Product(sa.w_o.weight, sa.w_o.bias)
        self.cq, self.co = Product(ca.w_q.weight, ca.w_q.bias), Product(ca.w_o.weight, ca.w_o.bias)
        self.f1, self.f2 = Product(ffn.w_1.weight, ffn.w_1.bias), Product(ffn.w_2.weight, ffn.w_2.bias)
        self.norm0, self.norm1, self.norm2 = (Norm(sub.layer_norm) for sub in layer.sublayer)


class DecoderStep(nn.Module):
    """The decoder's weights for one step (cross-attention's W^K, W^V act once per batch, in SourceStep):
    the target embedding and positions, LayerWeights per layer, the final norm (pre-norm), the head."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        cfg = self.cfg = model.cfg
        self.heads, self.d_k, self.d_v = cfg.heads, cfg.d_k, cfg.d_v
        self.score_scale = 1.0 / math.sqrt(cfg.d_k) if cfg.scale_scores else 1.0
        embed = model.tgt_embed
        self.token = _fixed(embed.token.weight)                             # (vocab, d)
        self.scale = embed.scale
        table = None
        if embed.sinusoidal:
            table = embed.position_table(torch.float32, embed.token.weight.device)
        elif embed.learned is not None:
            table = embed.learned.table.weight
        self.positions = _fixed(table)                                      # (max_len, d) or None
        self.post = cfg.norm_placement == "post"
        self.relu = cfg.activation == "relu"
        self.layers = nn.ModuleList(LayerWeights(layer) for layer in model.decoder.layers)
        self.norm = None if model.decoder.norm is None else Norm(model.decoder.norm)
        self.head = Product(model.head.weight, model.head.bias)             # W^T (d, vocab)

    def _residual(self, x: Tensor, norm: Norm, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """post: LN(x + Sub(x)); pre: x + Sub(LN(x))."""
        if self.post:
            return norm.forward(x + sublayer(x))
        return x + sublayer(norm.forward(x))

    def logits(self, tokens: Tensor, pos: Tensor, self_k: list[Tensor], self_v: list[Tensor],
               cross_k: list[Tensor], cross_v: list[Tensor], source: Tensor) -> Tensor:
        """tokens (rows,) at position `pos` (0-dim) -> next-token logits (rows, vocab).

        Writes this step's K/V rows into self_k/self_v (rows, heads, positions, d) at `pos`; `source`
        (rows, 1, 1, src) True = may attend."""
        rows, H = tokens.size(0), self.heads
        x = F.embedding(tokens, self.token)                                 # (rows, d)
        if self.positions is not None:
            x = torch.add(self.positions.index_select(0, pos.view(1)), x, alpha=self.scale)
        else:
            x = x * self.scale
        x = x[:, None]                                                       # (rows, 1, d)
        at = pos.view(1)
        visible = (torch.arange(self_k[0].size(2), device=pos.device) <= pos).view(1, 1, 1, -1)  # (1, 1, 1, positions)

        for p, k_buf, v_buf, ck, cv in zip(self.layers, self_k, self_v, cross_k, cross_v, strict=True):
            def attend_self(h: Tensor, p=p, k_buf=k_buf, v_buf=v_buf) -> Tensor:
                qkv = p.qkv.forward(h)                                       # (rows, 1, 3 H d_k)
                q, k, v = qkv.view(rows, 1, 3, H, -1).permute(2, 0, 3, 1, 4)  # each (rows, heads, 1, d_k)
                k_buf.index_copy_(2, at, k)                                  # (rows, heads, positions, d_k)
                v_buf.index_copy_(2, at, v)
                out = self._attend(q, k_buf, v_buf, visible)                 # (rows, heads, 1, d_v)
                return p.o.forward(out.transpose(1, 2).reshape(rows, 1, -1))

            def attend_source(h: Tensor, p=p, ck=ck, cv=cv) -> Tensor:
                q = p.cq.forward(h).view(rows, 1, H, -1).transpose(1, 2)    # (rows, heads, 1, d_k)
                out = self._attend(q, ck, cv, source)                        # (rows, heads, 1, d_v)
                return p.co.forward(out.transpose(1, 2).reshape(rows, 1, -1))

            def feed_forward(h: Tensor, p=p) -> Tensor:
                hidden = p.f1.forward(h)                                     # (rows, 1, d_ff)
                hidden = torch.relu(hidden) if self.relu else F.silu(hidden)
                return p.f2.forward(hidden)                                  # (rows, 1, d)

            x = self._residual(x, p.norm0, attend_self)
            x = self._residual(x, p.norm1, attend_source)
            x = self._residual(x, p.norm2, feed_forward)
        if self.norm is not None:
            x = self.norm.forward(x)
        return self.head.forward(x[:, 0])                                    # (rows, vocab)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, visible: Tensor) -> Tensor:
        """softmax(q k^T / sqrt(d_k), masked) v for one query row: q (rows, heads, 1, d_k), k, v (rows, heads,
        keys, d), visible (rows | 1, 1, 1, keys) -> (rows, heads, 1, d_v). Every row sees a key (its own
        position; a source of only PAD sees every key, SourceStep). Eagerly through torch's fused attention
        (one call); traced, the formula written out, which the compiler fuses into one loop of its own."""
        if not torch.compiler.is_compiling():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=self.score_scale)
        scores = (q @ k.transpose(-2, -1)) * self.score_scale               # (rows, heads, 1, keys)
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        return weights @ v                                                   # (rows, heads, 1, d_v)
