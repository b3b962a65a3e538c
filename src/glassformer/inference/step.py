"""StepDecoder: the decoder's incremental path for one new token per row, with prepared weights.

The same arithmetic as `Transformer.decode_step` (model/, the reference) for one query row per
sentence, in fewer operations: rows stay 2-D (batch, d); self-attention writes its K/V row into the
static cache and its single query sees every cached row, so no triangle is built; cross-attention
projects the encoder output once; residual sums and ReLU run in place on fresh outputs. Hooks are
not fired here: to observe or intervene, run the model itself.

    decoder = StepDecoder(model)                          # after training: weights are copied now
    memory = decoder.encode(src, src_pad)
    cache = decoder.new_cache()
    logits = decoder.decode_step(tokens, memory, src_pad, cache)   # tokens (batch, 1) -> (batch, 1, V)
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model.layers import ResidualNorm
from ..model.transformer import Transformer
from .cache import StaticCache
from .weights import ONEDNN, PreparedLinear


class _Layer:
    """One decoder layer's prepared projections."""

    def __init__(self, layer: nn.Module, onednn: bool) -> None:
        self.layer = layer
        sa, ca = layer.self_attention, layer.cross_attention
        self.qkv = _fused(onednn, sa.w_q, sa.w_k, sa.w_v)                   # [W^Q | W^K | W^V] in one product
        self.self_out = PreparedLinear.of(sa.w_o, onednn)
        self.q = PreparedLinear.of(ca.w_q, onednn)
        self.kv = _fused(onednn, ca.w_k, ca.w_v)                             # [W^K | W^V] of the source
        self.cross_out = PreparedLinear.of(ca.w_o, onednn)
        self.w_1 = PreparedLinear.of(layer.ffn.w_1, onednn)
        self.w_2 = PreparedLinear.of(layer.ffn.w_2, onednn)
        self.activation = layer.ffn.activation


def _fused(onednn: bool, *linears: nn.Linear) -> PreparedLinear:
    """One prepared product for several projections of the same input: their output columns side by side."""
    weight = torch.cat([lin.weight for lin in linears])                      # (sum of out, in)
    bias = None if linears[0].bias is None else torch.cat([lin.bias for lin in linears])
    return PreparedLinear(weight, bias, onednn)


class _Prepared(nn.Module):
    """Stands in for an nn.Linear of a copied stack: the same product on prepared weights, any leading dims."""

    def __init__(self, linear: nn.Linear, onednn: bool) -> None:
        super().__init__()
        self.prepared = PreparedLinear.of(linear, onednn)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        out = self.prepared(x.reshape(-1, x.size(-1)))                       # (rows, out)
        return out.view(*x.shape[:-1], self.out_features)                     # (..., out)


def _prepared_copy(module: nn.Module, onednn: bool) -> nn.Module:
    """A copy of `module` whose nn.Linear layers multiply with prepared weights (the model is untouched)."""
    module = copy.deepcopy(module)
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, _Prepared(child, onednn))
    return module


def _residual(sub: ResidualNorm, x: Tensor, sublayer, *args) -> Tensor:
    """post: LN(x + Sub(x)); pre: x + Sub(LN(x)) — eval mode, the sum written into Sub's fresh output."""
    n = sub.layer_norm
    if sub.placement == "post":
        return F.layer_norm(sublayer(x, *args).add_(x), n.normalized_shape, n.weight, n.bias, n.eps)
    return sublayer(F.layer_norm(x, n.normalized_shape, n.weight, n.bias, n.eps), *args).add_(x)


def _ffn(x: Tensor, p: _Layer) -> Tensor:
    return p.w_2(p.activation(p.w_1(x)))                                     # (batch, d)


class StepDecoder:
    """Greedy and beam search's view of a Transformer: encode, new_cache, decode_step (translation/decode.py)."""

    def __init__(self, model: Transformer, onednn: bool = ONEDNN) -> None:
        if not isinstance(model, Transformer):
            raise TypeError(f"StepDecoder needs an encoder-decoder Transformer, got {type(model).__name__}")
        self.model, self.cfg = model, model.cfg
        self.encoder = _prepared_copy(model.encoder, onednn).eval()         # the same encoder, prepared weights
        self.layers = [_Layer(layer, onednn) for layer in model.decoder.layers]
        self.head = PreparedLinear.of(model.head, onednn)
        a = model.decoder.layers[0].self_attention
        self.heads, self.d_k, self.d_v = a.heads, a.d_k, a.d_v
        self.scale = 1.0 / math.sqrt(a.d_k) if a.scale else 1.0

    @torch.no_grad()
    def encode(self, src: Tensor, src_pad: Tensor | None = None) -> Tensor:
        """src ids (batch, src) -> H (batch, src, d): the model's encoder, on prepared weights."""
        src_pad = self.model.source_padding(src) if src_pad is None else src_pad
        return self.encoder(self.model.src_embed(src), src_pad)              # (batch, src, d)

    def new_cache(self) -> StaticCache:
        return StaticCache(len(self.layers), self.cfg.max_len)

    @torch.no_grad()
    def decode_step(self, tokens: Tensor, memory: Tensor, src_pad: Tensor | None, cache: StaticCache) -> Tensor:
        """The newest token of each row (batch, 1) -> next-token logits (batch, 1, vocab)."""
        if tokens.size(1) != 1:
            raise ValueError(f"decode_step takes one new token per row, got {tokens.size(1)}")
        if memory is None:
            raise ValueError("decode_step needs the encoder output (memory)")
        y = self.model.tgt_embed(tokens, offset=cache.length)[:, 0]          # (batch, d)
        cache.allocate(y.size(0), self.heads, self.d_k, self.d_v, y)
        mask, keep = cache.source_visibility(src_pad)
        for i, p in enumerate(self.layers):
            sub = p.layer.sublayer
            y = _residual(sub[0], y, self._self_attention, i, p, cache)
            y = _residual(sub[1], y, self._cross_attention, i, p, memory, mask, keep, cache)
            y = _residual(sub[2], y, _ffn, p)
        cache.length += 1
        norm = self.model.decoder.norm
        if norm is not None:
            y = norm(y)
        return self.head(y)[:, None]                                         # (batch, 1, vocab)

    def _self_attention(self, x: Tensor, i: int, p: _Layer, cache: StaticCache) -> Tensor:
        b, h, d_k, d_v = x.size(0), self.heads, self.d_k, self.d_v
        a = p.layer.self_attention
        qkv = p.qkv(x)                                                       # (batch, H*(2d_k+d_v))
        if d_k == d_v:
            q, k, v = qkv.view(b, 3, h, 1, d_k).unbind(1)                    # 3 x (batch, heads, 1, d_k)
        else:
            q, k, v = qkv.split((h * d_k, h * d_k, h * d_v), dim=1)
            q, k, v = q.view(b, h, 1, d_k), k.view(b, h, 1, d_k), v.view(b, h, 1, d_v)
        bias = None
        if a.rope is not None or a.relative is not None:
            pos = torch.tensor([cache.length], device=x.device)              # this row's position
            if a.rope is not None:
                q, k = a.rope(q, pos), a.rope(k, pos)
            if a.relative is not None:
                bias = a.relative(pos, torch.arange(cache.length + 1, device=x.device)).to(q.dtype)  # (H, 1, key)
        k, v = cache.append(i, k, v)                                         # (batch, heads, key, d)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=self.scale)  # (batch, heads, 1, d_v)
        return p.self_out(out.reshape(b, h * d_v))                           # (batch, d)

    def _cross_attention(self, x: Tensor, i: int, p: _Layer, memory: Tensor, mask: Tensor | None,
                         keep: Tensor | None, cache: StaticCache) -> Tensor:
        b, h, d_k, d_v = x.size(0), self.heads, self.d_k, self.d_v
        if len(cache.cross) <= i:                                            # first step: K/V of the source
            n, s = memory.size(0), memory.size(1)
            kv = p.kv(memory.reshape(n * s, -1))                             # (batch*src, H*(d_k+d_v))
            k, v = kv.view(n, s, -1).split((h * d_k, h * d_v), dim=-1)
            cache.cross.append((k.view(n, s, h, d_k).transpose(1, 2), v.view(n, s, h, d_v).transpose(1, 2)))
        k, v = cache.cross[i]                                                # (batch, heads, src, d)
        q = p.q(x).view(b, h, 1, d_k)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)  # (batch, heads, 1, d_v)
        if keep is not None:
            out = out * keep                                                 # a source of only PAD reads zeros
        return p.cross_out(out.reshape(b, h * d_v))                          # (batch, d)
