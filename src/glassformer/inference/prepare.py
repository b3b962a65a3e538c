"""prepare(model): the same model for decoding, its projections multiplying with prepared weights.

    fast = prepare(model)                             # a copy: the model itself is untouched
    memory = fast.encode(src, src_pad)
    cache = fast.new_cache()
    logits = fast.decode_step(tokens, memory, src_pad, cache)    # the model's own decoder and KV cache

The copy is the same class with the same forward; only modules are swapped: every nn.Linear for a
`Prepared` one (W laid out once, weights.py), each self-attention's W^Q, W^K, W^V for one product
[W^Q | W^K | W^V], every hook point for an inert identity (nothing fires; to observe or intervene, run
the model itself), and attention on SDPA. Tests hold its tokens identical and its logits equal to the
model's to float rounding (tests/test_inference.py).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from ..model.attention import MultiHeadAttention, SelfAttention
from ..model.hooks import HookPoint
from .weights import ONEDNN, PreparedLinear


class Prepared(nn.Module):
    """Stands in for an nn.Linear: the same product x W^T + b on prepared weights, any leading dims."""

    def __init__(self, weight: Tensor, bias: Tensor | None, onednn: bool) -> None:
        super().__init__()
        self.prepared = PreparedLinear(weight, bias, onednn)
        self.out_features = weight.size(0)

    def forward(self, x: Tensor) -> Tensor:
        out = self.prepared(x.reshape(-1, x.size(-1)))                       # (rows, out)
        return out.view(*x.shape[:-1], self.out_features)                     # (..., out)


class FusedSelfAttention(SelfAttention):
    """SelfAttention whose Q, K, V come from one product x [W^Q | W^K | W^V] (`w_qkv`): the same numbers."""

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        h = self.heads
        q, k, v = self.w_qkv(x).split((h * self.d_k, h * self.d_k, h * self.d_v), dim=-1)
        return self.split_heads(q, self.d_k), self.split_heads(k, self.d_k), self.split_heads(v, self.d_v)


class Inert(nn.Module):
    """A hook point that returns its input and accepts nothing (`fns` stays empty)."""

    fns = ()

    def __call__(self, x: Tensor) -> Tensor:
        return x


def prepare(model: nn.Module, onednn: bool = ONEDNN) -> nn.Module:
    """A decoding copy of `model` (any family), in eval mode, without gradients; see the module doc.

    The weights are copied now: prepare again after training changes them. `onednn` picks oneDNN's
    pre-blocked weights where this torch build has them (weights.py)."""
    fast = copy.deepcopy(model).eval().requires_grad_(False)
    for module in list(fast.modules()):
        if isinstance(module, SelfAttention):
            weights = [module.w_q, module.w_k, module.w_v]
            bias = None if weights[0].bias is None else torch.cat([w.bias for w in weights])
            module.__class__ = FusedSelfAttention
            module.w_qkv = Prepared(torch.cat([w.weight for w in weights]), bias, onednn)
            del module.w_q, module.w_k, module.w_v
        if isinstance(module, MultiHeadAttention):
            module.path, module._head_hooks = "fast", False                 # no hook can attach: SDPA
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, Prepared(child.weight, child.bias, onednn))
            elif isinstance(child, HookPoint):
                setattr(module, name, Inert())
    return fast
