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


def _laid_out(weights: dict[str, Tensor | None]) -> nn.ParameterDict:
    """Copies of `weights`; a wide W `name_w` (out >= in) as its contiguous W^T `name_wt` (in, out), which a
    product of a few rows streams about twice as fast (weights.py)."""
    out = {}
    for name, t in weights.items():
        if t is None:
            continue
        if name.endswith("w") and t.dim() == 2 and t.size(0) >= t.size(1):
            out[name + "t"] = _fixed(t.t().contiguous())                     # (in, out)
        else:
            out[name] = _fixed(t)
    return nn.ParameterDict(out)


class DecoderStep(nn.Module):
    """The decoder's weights for one step: per layer [W^Q|W^K|W^V], W^O, cross W^Q, W^O, FFN and norms
    (cross-attention's W^K, W^V act once per batch, in SourceStep)."""

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
        self.layers = nn.ModuleList(self._layer(layer) for layer in model.decoder.layers)
        norm = model.decoder.norm
        self.norm = None if norm is None else nn.ParameterList([_fixed(norm.weight), _fixed(norm.bias)])
        self.eps = cfg.eps
        self.head = _laid_out({"head_w": model.head.weight, "head_b": model.head.bias})   # W^T (d, vocab)

    @staticmethod
    def _layer(layer) -> nn.ParameterDict:
        sa, ca, ffn = layer.self_attention, layer.cross_attention, layer.ffn
        qkv = [sa.w_q, sa.w_k, sa.w_v]
        p = {"qkv_w": torch.cat([w.weight for w in qkv]),                   # [W^Q | W^K | W^V] (3 H d_k, d)
             "qkv_b": None if sa.w_q.bias is None else torch.cat([w.bias for w in qkv]),
             "o_w": sa.w_o.weight, "o_b": sa.w_o.bias,
             "cq_w": ca.w_q.weight, "cq_b": ca.w_q.bias, "co_w": ca.w_o.weight, "co_b": ca.w_o.bias,
             "f1_w": ffn.w_1.weight, "f1_b": ffn.w_1.bias, "f2_w": ffn.w_2.weight, "f2_b": ffn.w_2.bias}
        for i, sub in enumerate(layer.sublayer):
            p[f"n{i}_w"], p[f"n{i}_b"] = sub.layer_norm.weight, sub.layer_norm.bias
        return _laid_out(p)

    def _get(self, p: nn.ParameterDict, name: str) -> Tensor | None:
        return p[name] if name in p else None

    def _linear(self, p: nn.ParameterDict, name: str, x: Tensor) -> Tensor:
        """x W^T + b for x (..., in): from W^T (in, out) where `_laid_out` made one, else from W."""
        b = self._get(p, name + "_b")
        if name + "_wt" not in p:
            return F.linear(x, p[name + "_w"], b)
        wt = p[name + "_wt"]
        rows = x.reshape(-1, x.size(-1))                                     # (rows, in)
        out = torch.mm(rows, wt) if b is None else torch.addmm(b, rows, wt)  # (rows, out)
        return out.view(*x.shape[:-1], wt.size(1))

    def _residual(self, x: Tensor, p: nn.ParameterDict, i: int, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """post: LN(x + Sub(x)); pre: x + Sub(LN(x))."""
        w, b = p[f"n{i}_w"], self._get(p, f"n{i}_b")
        if self.post:
            return F.layer_norm(x + sublayer(x), (x.size(-1),), w, b, self.eps)
        return x + sublayer(F.layer_norm(x, (x.size(-1),), w, b, self.eps))

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
                qkv = self._linear(p, "qkv", h)                              # (rows, 1, 3 H d_k)
                q, k, v = qkv.view(rows, 1, 3, H, -1).permute(2, 0, 3, 1, 4)  # each (rows, heads, 1, d_k)
                k_buf.index_copy_(2, at, k)                                  # (rows, heads, positions, d_k)
                v_buf.index_copy_(2, at, v)
                out = self._attend(q, k_buf, v_buf, visible)                 # (rows, heads, 1, d_v)
                return self._linear(p, "o", out.transpose(1, 2).reshape(rows, 1, -1))

            def attend_source(h: Tensor, p=p, ck=ck, cv=cv) -> Tensor:
                q = self._linear(p, "cq", h).view(rows, 1, H, -1).transpose(1, 2)   # (rows, heads, 1, d_k)
                out = self._attend(q, ck, cv, source)                        # (rows, heads, 1, d_v)
                return self._linear(p, "co", out.transpose(1, 2).reshape(rows, 1, -1))

            def feed_forward(h: Tensor, p=p) -> Tensor:
                hidden = self._linear(p, "f1", h)                            # (rows, 1, d_ff)
                hidden = torch.relu(hidden) if self.relu else F.silu(hidden)
                return self._linear(p, "f2", hidden)                         # (rows, 1, d)

            x = self._residual(x, p, 0, attend_self)
            x = self._residual(x, p, 1, attend_source)
            x = self._residual(x, p, 2, feed_forward)
        if self.norm is not None:
            x = F.layer_norm(x, (x.size(-1),), self.norm[0], self.norm[1], self.eps)
        return self._linear(self.head, "head", x[:, 0])                      # (rows, vocab)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, visible: Tensor) -> Tensor:
        """softmax(q k^T / sqrt(d_k), masked) v for one query row: q (rows, heads, 1, d_k), k, v (rows, heads,
        keys, d), visible (rows | 1, 1, 1, keys) -> (rows, heads, 1, d_v)."""
        scores = (q @ k.transpose(-2, -1)) * self.score_scale               # (rows, heads, 1, keys)
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        return weights @ v                                                   # (rows, heads, 1, d_v)
