"""x W^T + b for the model's projections, in the layout the CPU reads fastest when no gradient is recorded.

nn.Linear stores W as (out, in). Decoding multiplies a handful of rows, so each product streams all of
W; on the CPU a wide W (out >= in: W^Q|W^K|W^V, W_1, the vocabulary head) streams about twice as fast
from a contiguous copy of W^T (in, out). Training keeps `F.linear` (autograd); without autograd on the
CPU a cached W^T is used, rebuilt whenever W changes (its version counter moves on every in-place
update). The numbers are the same product, summed in another order (float rounding only).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import Tensor

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


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, rows: slice | None = None) -> Tensor:
    """x W^T + b, optionally for the output features `rows` of W only (a slice of W's rows).

    x: (..., in) -> (..., out). Same result as F.linear(x, weight[rows], bias[rows]).
    """
    w = weight if rows is None else weight[rows]
    b = bias if bias is None or rows is None else bias[rows]
    if w.size(0) < w.size(1) or (wt := wide_columns(weight)) is None:
        return F.linear(x, w, b)
    if rows is not None:
        wt = wt[:, rows]                                                     # (in, out) column slice
    if b is None:
        return x @ wt
    return torch.addmm(b, x.reshape(-1, x.size(-1)), wt).view(*x.shape[:-1], wt.size(1))
