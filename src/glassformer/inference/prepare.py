"""prepare(model): the same model for decoding, its projections multiplying with prepared weights.

    fast = prepare(model)                             # a copy: the model itself is untouched
    memory = fast.encode(src, src_pad)
    cache = fast.new_cache()
    logits = fast.decode_step(tokens, memory, src_pad, cache)    # the model's own decoder and KV cache

The copy has the same classes' forwards; only modules are swapped: every nn.Linear for a
`PreparedLinear` (W laid out once, weights.py), each self-attention's W^Q, W^K, W^V for one product
[W^Q | W^K | W^V], every LayerNorm for one that calls the op without the functional wrapper (and
ReLU likewise), every hook point and every dropout (identity in eval) for an inert identity (nothing
fires; to observe or intervene, run the model itself), and attention on SDPA. Its modules are called
straight through `forward`, without nn.Module's hook dispatch, and find their children by plain
attribute lookup: a decoding step is about 60 module calls, and at batch 1 that dispatch was a third
of the step's time (docs/performance.md). Tests hold its tokens identical and its logits equal to the
model's to float rounding (tests/test_inference.py).
"""

from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model.attention import MultiHeadAttention, SelfAttention
from ..model.hooks import HookPoint
from .weights import ONEDNN, PreparedLinear


class FusedSelfAttention(SelfAttention):
    """SelfAttention whose Q, K, V come from one product x [W^Q | W^K | W^V] (`w_qkv`): the same numbers."""

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        h = self.heads
        q, k, v = self.w_qkv(x).split_with_sizes((h * self.d_k, h * self.d_k, h * self.d_v), dim=-1)
        return self.split_heads(q, self.d_k), self.split_heads(k, self.d_k), self.split_heads(v, self.d_v)


class PreparedLayerNorm(nn.LayerNorm):
    """nn.LayerNorm calling the op itself, without the functional wrapper: the same numbers."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class Inert(nn.Module):
    """A hook point that returns its input and accepts nothing (`fns` stays empty)."""

    fns = ()

    def __call__(self, x: Tensor) -> Tensor:
        return x


def _item(self: nn.ModuleList, index):
    return self.__dict__["_items"][index] if isinstance(index, int) else nn.ModuleList.__getitem__(self, index)


@functools.cache
def _direct(cls: type) -> type:
    """`cls` with `__call__` = `forward`: no nn.Module hook dispatch (nothing can be attached to the copy);
    a ModuleList indexed as a list."""
    extra = {"__getitem__": _item} if issubclass(cls, nn.ModuleList) else {}
    return type(cls.__name__, (cls,), {"__call__": cls.forward, "__module__": cls.__module__, **extra})


def prepare(model: nn.Module, onednn: bool = ONEDNN) -> nn.Module:
    """A decoding copy of `model` (any family), in eval mode, without gradients; see the module doc.

    The weights are copied now, on the model's device and in its dtype: prepare again after training
    changes them or after moving the model (the copy itself is not meant to be moved). `onednn` picks
    oneDNN's pre-blocked weights where this torch build has them (weights.py)."""
    fast = copy.deepcopy(model).eval().requires_grad_(False)
    for module in list(fast.modules()):
        if isinstance(module, SelfAttention):
            weights = [module.w_q, module.w_k, module.w_v]
            bias = None if weights[0].bias is None else torch.cat([w.bias for w in weights])
            module.__class__ = FusedSelfAttention
            module.w_qkv = PreparedLinear(torch.cat([w.weight for w in weights]), bias, onednn)
            del module.w_q, module.w_k, module.w_v
        if type(module) is nn.LayerNorm:
            module.__class__ = PreparedLayerNorm
        if getattr(module, "activation", None) is F.relu:                    # FeedForward: the op itself
            module.activation = torch.relu
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, PreparedLinear.of(child, onednn))
    return streamline(fast)


def streamline(fast: nn.Module) -> nn.Module:
    """In place, on a decoding copy (prepare's, or with_precision's): every hook point and dropout becomes
    an inert identity, attention runs on SDPA, modules are called straight through `forward` and find their
    children and weights by plain attribute lookup. Returns `fast`."""
    for module in list(fast.modules()):
        if isinstance(module, MultiHeadAttention):
            module.path, module._head_hooks = "fast", False                 # no hook can attach: SDPA
        for name, child in list(module.named_children()):
            if isinstance(child, (HookPoint, nn.Dropout)):
                setattr(module, name, Inert())
    for module in fast.modules():
        if type(module).__call__ is nn.Module.__call__:
            module.__class__ = _direct(type(module))
        module.__dict__.update(module._modules)                              # children and weights:
        module.__dict__.update(module._parameters)                           # plain attribute lookups
        if isinstance(module, nn.ModuleList):
            module.__dict__["_items"] = list(module._modules.values())
    return fast
