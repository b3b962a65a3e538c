"""x W^T + b for the model's projections, in the layout the CPU reads fastest when no gradient is recorded.

nn.Linear stores W as (out, in). Decoding multiplies a handful of rows, so each product streams all of
W; on the CPU a wide W (out >= in: W^Q|W^K|W^V, W_1, the vocabulary head) streams about twice as fast
from a contiguous copy of W^T (in, out). From PACKED_MIN_ROWS rows on (batched decoding, encoding),
oneDNN's pre-blocked copy of W is faster still: MKL would re-block W on every call. Training keeps
`F.linear` (autograd); without autograd on the CPU the copies are cached per weight and rebuilt whenever
W changes (its version counter moves on every in-place update). The numbers are the same product, summed
in another order (float rounding only).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import Tensor

PACKED_MIN_ROWS = 4            # from 4 rows on the blocked copy wins for every shape measured (performance.md)
_ONEDNN = (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
           and hasattr(torch.ops.mkldnn, "_linear_pointwise"))

_COLUMNS: dict[int, tuple[weakref.ref, tuple, Tensor]] = {}   # id(weight) -> (weight, version key, W^T)


def wide_columns(weight: Tensor) -> Tensor | None:
    """The cached contiguous W^T (in, out) where it is faster: CPU, no autograd, out >= in. Else None."""
    if torch.is_grad_enabled() or weight.device.type != "cpu" or weight.size(0) < weight.size(1):
        return None
    key, ident = (weight.data_ptr(), weight._version, weight.dtype), id(weight)
    hit = _COLUMNS.get(ident)
    if hit is None or hit[0]() is not weight or hit[1] != key:
        with torch.inference_mode(False):                                   # a normal tensor, usable anywhere
            columns = weight.detach().t().contiguous()                      # (in, out)
        ref = weakref.ref(weight, lambda _: _COLUMNS.pop(ident, None))      # dropped with the weight
        hit = _COLUMNS[ident] = (ref, key, columns)
    return hit[2]


class _Plan:
    """How one (W, b, rows) product runs without autograd: the slices, W^T and the blocked copy, made once."""

    __slots__ = ("weight", "bias", "key", "w", "b", "wt", "packed")

    def __init__(self, weight: Tensor, bias: Tensor | None, rows: slice | None, key: tuple) -> None:
        self.weight, self.key = weakref.ref(weight), key
        self.bias = None if bias is None else weakref.ref(bias)
        self.w = weight if rows is None else weight[rows]                   # (out, in)
        self.b = bias if bias is None or rows is None else bias[rows]       # (out,)
        wt = wide_columns(weight) if self.w.size(0) >= self.w.size(1) else None
        self.wt = wt if wt is None or rows is None else wt[:, rows]         # (in, out) or None
        self.packed: Tensor | None = None                                   # oneDNN blocked W, on first use

    def valid(self, weight: Tensor, bias: Tensor | None, key: tuple) -> bool:
        return (self.weight() is weight and self.key == key
                and (bias is None or (self.bias is not None and self.bias() is bias)))


_PLANS: dict[tuple, _Plan] = {}


def _plan(weight: Tensor, bias: Tensor | None, rows: slice | None) -> _Plan:
    slot = (id(weight), id(bias), None if rows is None else (rows.start, rows.stop))
    key = (weight.data_ptr(), weight._version, weight.dtype)
    plan = _PLANS.get(slot)
    if plan is None:
        weakref.finalize(weight, _PLANS.pop, slot, None)                     # dropped with the weight
    if plan is None or not plan.valid(weight, bias, key):
        plan = _PLANS[slot] = _Plan(weight, bias, rows, key)
    return plan


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, rows: slice | None = None) -> Tensor:
    """x W^T + b, optionally for the output features `rows` of W only (a slice of W's rows).

    x: (..., in) -> (..., out). Same result as F.linear(x, weight[rows], bias[rows]).
    """
    if torch.is_grad_enabled() or not weight.is_cpu:                        # training / other devices
        return F.linear(x, weight if rows is None else weight[rows],
                        bias if bias is None or rows is None else bias[rows])
    p = _plan(weight, bias, rows)
    flat = x if x.dim() == 2 else x.reshape(-1, x.size(-1))                 # (rows, in); decoding steps are 2-D
    if flat.size(0) >= PACKED_MIN_ROWS and _ONEDNN and x.dtype == weight.dtype == torch.float32:
        if p.packed is None:
            with torch.inference_mode(False):
                p.packed = torch.ops.mkldnn._reorder_linear_weight(p.w.detach().contiguous(), 32)
        out = torch.ops.mkldnn._linear_pointwise(flat, p.packed, p.b, "none", [], "")
    elif p.wt is None:
        out = F.linear(flat, p.w, p.b)
    elif p.b is None:
        out = torch.mm(flat, p.wt)
    else:
        out = torch.addmm(p.b, flat, p.wt)                                   # (rows, out)
    return out if flat is x else out.view(*x.shape[:-1], out.size(-1))     # (..., out)
