"""prepare(model): the same model for decoding, its projections multiplying with prepared weights.

    fast = prepare(model)                             # a copy: the model itself is untouched
    logits = fast.decode_step(tokens, fast.encode(src, src_pad), src_pad, fast.new_cache())   # the model's own

The copy keeps the model's forwards; nn.Linear becomes `PreparedLinear`, self-attention `FusedSelfAttention` (one
product [W^Q | W^K | W^V]), hook points and dropout an `Inert` identity (to observe, run the model itself), attention
on SDPA, modules called straight through forward (`_direct`); the compiled step traces `prepare(model, onednn=False,
direct=False, transposed=True)`. Tests hold its tokens identical, its logits the model's (tests/test_inference.py).

`PreparedLinear`: a step streams all of W for a handful of rows; a wide W (out >= in: W^Q|W^K|W^V, W_1, the head)
streams about twice as fast as a contiguous W^T (in, out); from PACKED_MIN_ROWS rows on oneDNN's pre-blocked W (private
ops, where `ONEDNN` finds them; tests hold both routes equal). `transposed` (the compiled step's): W^T for every W, no
product on a transposed operand (W_2 at 32 rows: 1.4x faster), and where torch has MKL, MKL's packed W (`mkl`, as
CTranslate2 multiplies) for a row count known when traced (docs/performance.md). Weights copied: prepare after training.
"""

from __future__ import annotations

import contextlib
import copy
import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model.attention import MultiHeadAttention, SelfAttention
from ..model.hooks import HookPoint

PACKED_MIN_ROWS = 4            # from 4 rows on the blocked copy wins for every shape measured
PACK_BATCH_HINT = 32           # the row count oneDNN blocks W for


def _onednn_available() -> bool:
    ops, names = getattr(torch.ops, "mkldnn", None), ("_reorder_linear_weight", "_linear_pointwise")
    try:
        return torch.backends.mkldnn.is_available() and all(hasattr(ops, n) for n in names)
    except (AttributeError, RuntimeError):
        return False


ONEDNN = _onednn_available()
MKL = ONEDNN and torch._C.has_mkl and hasattr(torch.ops.mkl, "_mkl_linear")   # (a pack's stand-in: an mkldnn tensor)


@contextlib.contextmanager
def packs_left_out(module: nn.Module):
    """`module`'s MKL packs each replaced, for a trace, by a stand-in too big to be inlined and of a shape no dense
    constant has (inductor compares same-shaped constants' storages): a pack holds its own address (compiler._load)."""
    packs = {m: m.mkl for m in module.modules() if isinstance(m, PreparedLinear) and m.mkl is not None}
    for m in packs:
        m.mkl = nn.Parameter(torch.zeros(1, 1, 64).to_mkldnn(), requires_grad=False)   # see the docstring
    try:
        yield
    finally:
        for m, pack in packs.items():
            m.mkl = pack


class PreparedLinear(nn.Module):
    """Stands in for an nn.Linear: x W^T + b for x (..., in) -> (..., out), with W laid out once for inference."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None, onednn: bool = ONEDNN, transposed: bool = False):
        super().__init__()
        with torch.inference_mode(False), torch.no_grad():                   # plain tensors, usable anywhere
            self.w = weight.detach().contiguous()                            # (out, in)
            self.b = None if bias is None else bias.detach().contiguous()    # (out,)
            self.out_features = self.w.size(0)
            wide = (transposed or self.w.size(0) >= self.w.size(1)) and self.w.device.type == "cpu"
            self.wt = self.w.t().contiguous() if wide else None              # (in, out) or None
            packs = onednn and self.w.device.type == "cpu" and self.w.dtype == torch.float32
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.w, PACK_BATCH_HINT) if packs else None
            mkl = transposed and MKL and self.w.device.type == "cpu" and self.w.dtype == torch.float32   # a Parameter:
            self.mkl = nn.Parameter(torch.ops.mkl._mkl_reorder_linear_weight(self.w, PACK_BATCH_HINT),   # W alone
                                    requires_grad=False) if mkl else None    # sizes a pack; a package names it

    def forward(self, x: Tensor) -> Tensor:
        rows = (x if x.dtype == self.w.dtype else x.to(self.w.dtype)).reshape(-1, x.size(-1))   # (rows, in), W's dtype
        later = None                                                         # a bias added after the view
        if self.mkl is not None and isinstance(rows.size(0), int):          # rows known here (or when traced)
            out = torch.ops.mkl._mkl_linear(rows, self.mkl, self.wt.t(), self.b, rows.size(0))
        elif self.packed is not None and rows.size(0) >= PACKED_MIN_ROWS:    # (packed: float32 weights)
            out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.b, "none", [], "")
        elif self.wt is None:
            out = F.linear(rows, self.w, self.b)
        elif self.b is None or self.w.dtype != torch.float32:               # bfloat16: b in the product, as eagerly
            out = torch.mm(rows, self.wt) if self.b is None else torch.addmm(self.b, rows, self.wt)
        else:     # float32 (rows, out): traced, b is added in the next kernel, not by an addmm that first copies it
            out, later = torch.mm(rows, self.wt), self.b   # to every row (a batch-32 job's source side: 213 -> 202 ms)
        out = (out if out.dtype == x.dtype else out.to(x.dtype)).view(*x.shape[:-1], self.out_features)   # x's dtype
        return out if later is None else out + later                        # (..., out)


class FusedSelfAttention(SelfAttention):
    """SelfAttention whose Q, K, V come from one product x [W^Q | W^K | W^V] (`w_qkv`): the same numbers."""

    @classmethod
    def of(cls, attention: SelfAttention, onednn: bool, transposed: bool = False) -> FusedSelfAttention:
        """A fused copy of `attention`: its sizes and options, its W^O, RoPE or relative bias, W^Q|W^K|W^V joined."""
        a = attention
        fused = cls(a.d_model, a.heads, a.d_k, a.d_v, bias=a.w_q.bias is not None, dropout=a.dropout, scale=a.scale,
                    rope=a.rope, relative=a.relative, path="fast")
        bias = None if a.w_q.bias is None else torch.cat([w.bias for w in (a.w_q, a.w_k, a.w_v)])
        fused.w_qkv = PreparedLinear(torch.cat([w.weight for w in (a.w_q, a.w_k, a.w_v)]), bias, onednn, transposed)
        fused.w_o = PreparedLinear(a.w_o.weight, a.w_o.bias, onednn, transposed)
        del fused.w_q, fused.w_k, fused.w_v
        return fused.to(a.w_o.weight.device).eval().requires_grad_(False)

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = self.w_qkv(x).split_with_sizes((self.heads * self.d_k,) * 2 + (self.heads * self.d_v,), dim=-1)
        return self.split_heads(q, self.d_k), self.split_heads(k, self.d_k), self.split_heads(v, self.d_v)


class Inert(nn.Identity):
    fns = ()                                                                 # a hook point that accepts nothing
    __call__ = nn.Identity.forward


def prepare(model: nn.Module, onednn: bool = ONEDNN, path="fast", direct=True, transposed=False) -> nn.Module:
    """A decoding copy of `model` (any family, module doc), eval, no gradients, its weights copied now (prepare
    again after training or moving the model). `onednn`: oneDNN's pre-blocked weights where this torch build has
    them; `path`: attention "fast" (SDPA) or "glass" (the formula written out); `direct`: see `_direct`."""
    fast = copy.deepcopy(model).eval().requires_grad_(False)
    for module in list(fast.modules()):
        if getattr(module, "activation", None) is F.relu:                    # FeedForward: the op itself
            module.activation = torch.relu
        for name, child in list(module.named_children()):
            if isinstance(child, SelfAttention) and child.w_q.weight.is_floating_point():   # (int8: three products)
                setattr(module, name, FusedSelfAttention.of(child, onednn, transposed))
            elif isinstance(child, nn.Linear):
                setattr(module, name, PreparedLinear(child.weight, child.bias, onednn, transposed))
    return streamline(fast, path, direct)


def streamline(fast: nn.Module, path: str = "fast", direct: bool = True) -> nn.Module:
    """In place, on a decoding copy (prepare's, or with_precision's): every hook point and dropout becomes an
    `Inert` identity, attention runs on `path` (default SDPA), with `direct` every module is `_direct`."""
    for module in list(fast.modules()):
        if isinstance(module, MultiHeadAttention):
            module.path, module._head_hooks = path, False
        for name, child in list(module.named_children()):
            if isinstance(child, (HookPoint, nn.Dropout)):
                setattr(module, name, Inert())
        _direct(module) if direct else None
    return fast


_called_by_forward = functools.cache(lambda cls: type(cls.__name__, (cls,), {"__call__": cls.forward}))  # noqa: E731


def _direct(module: nn.Module) -> None:
    """`module` called straight through forward, its children and weights plain attributes (no nn.Module dispatch
    or __getattr__; its weights fixed from then on): a greedy batch-1 step took 0.83x the time (d128, 2+2 layers)."""
    if type(module).__call__ is nn.Module.__call__:                        # HookPoint has its own
        module.__class__ = _called_by_forward(type(module))
    module.__dict__.update(module._modules, **module._parameters, **module._buffers)

