"""prepare(model): the same model for decoding, its projections multiplying with prepared weights.

    fast = prepare(model)                             # a copy: the model itself is untouched
    memory = fast.encode(src, src_pad)
    cache = fast.new_cache()
    logits = fast.decode_step(tokens, memory, src_pad, cache)    # the model's own decoder and KV cache

The copy keeps the model's classes and forwards; some children are replaced by others that compute the
same: every nn.Linear by a `PreparedLinear` (W laid out once, weights.py), each self-attention by a
`FusedSelfAttention` whose Q, K, V come from one product [W^Q | W^K | W^V], every hook point and every
dropout (identity in eval) by an inert identity (nothing fires; to observe or intervene, run the model
itself), and attention runs on SDPA. Translation runs it eagerly; `prepare(model, onednn=False)` is what
the compiled step traces (compiler.py). Tests hold its tokens identical and its logits equal to the
model's to float rounding (tests/test_inference.py).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model.attention import MultiHeadAttention, SelfAttention
from ..model.hooks import HookPoint
from .weights import ONEDNN, PreparedLinear


class FusedSelfAttention(SelfAttention):
    """SelfAttention whose Q, K, V come from one product x [W^Q | W^K | W^V] (`w_qkv`): the same numbers."""

    @classmethod
    def of(cls, attention: SelfAttention, onednn: bool) -> FusedSelfAttention:
        """A fused copy of `attention`: its sizes and options, its W^O, RoPE or relative bias, W^Q|W^K|W^V joined."""
        a = attention
        fused = cls(a.d_model, a.heads, a.d_k, a.d_v, bias=a.w_q.bias is not None, dropout=a.dropout, scale=a.scale,
                    rope=a.rope, relative=a.relative, path="fast")
        weights = [a.w_q, a.w_k, a.w_v]
        bias = None if a.w_q.bias is None else torch.cat([w.bias for w in weights])
        fused.w_qkv = PreparedLinear(torch.cat([w.weight for w in weights]), bias, onednn)
        fused.w_o = PreparedLinear.of(a.w_o, onednn)
        del fused.w_q, fused.w_k, fused.w_v
        return fused.to(a.w_o.weight.device).eval().requires_grad_(False)

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        h = self.heads
        q, k, v = self.w_qkv(x).split_with_sizes((h * self.d_k, h * self.d_k, h * self.d_v), dim=-1)
        return self.split_heads(q, self.d_k), self.split_heads(k, self.d_k), self.split_heads(v, self.d_v)


class Inert(nn.Module):
    """A hook point that returns its input and accepts nothing (`fns` stays empty)."""

    fns = ()

    def forward(self, x: Tensor) -> Tensor:
        return x


def prepare(model: nn.Module, onednn: bool = ONEDNN) -> nn.Module:
    """A decoding copy of `model` (any family), in eval mode, without gradients; see the module doc.

    The weights are copied now, on the model's device and in its dtype: prepare again after training
    changes them or after moving the model. `onednn` picks oneDNN's pre-blocked weights where this torch
    build has them (weights.py)."""
    fast = copy.deepcopy(model).eval().requires_grad_(False)
    for module in list(fast.modules()):
        if getattr(module, "activation", None) is F.relu:                    # FeedForward: the op itself
            module.activation = torch.relu
        for name, child in list(module.named_children()):
            if isinstance(child, SelfAttention):
                setattr(module, name, FusedSelfAttention.of(child, onednn))
            elif isinstance(child, nn.Linear):
                setattr(module, name, PreparedLinear.of(child, onednn))
    return streamline(fast)


def streamline(fast: nn.Module) -> nn.Module:
    """In place, on a decoding copy (prepare's, or with_precision's): every hook point and dropout becomes
    an inert identity and attention runs on SDPA. Returns `fast`."""
    for module in list(fast.modules()):
        if isinstance(module, MultiHeadAttention):
            module.path, module._head_hooks = "fast", False                 # no hook can attach: SDPA
        for name, child in list(module.named_children()):
            if isinstance(child, (HookPoint, nn.Dropout)):
                setattr(module, name, Inert())
    return fast
