"""Prepared weights: each projection of the decoding step in the layout the CPU multiplies fastest.

nn.Linear stores W as (out, in). A decoding step multiplies a handful of rows, so each product streams
all of W; a wide W (out >= in: W^Q|W^K|W^V, W_1, the vocabulary head) streams about twice as fast from a
contiguous copy of W^T (in, out). From PACKED_MIN_ROWS rows on (batched decoding), oneDNN's pre-blocked
copy of W is faster still: MKL would re-block W on every call. The copies are made once, by
`prepare(model)`, from the model's weights at that moment (prepare again after training changes them).
The numbers are the same product summed in another order: float rounding only.

oneDNN's pre-packing has no public eager API (torch.compile's inductor freezing reaches it, but compiling
was slower at batch 1 on this model, docs/performance.md), so the private ops are used only when
`ONEDNN` says this build has them; otherwise the W^T / F.linear route runs, and tests hold both equal.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

PACKED_MIN_ROWS = 4            # from 4 rows on the blocked copy wins for every shape measured
PACK_BATCH_HINT = 32           # the row count oneDNN blocks W for


def _onednn_available() -> bool:
    ops = getattr(torch.ops, "mkldnn", None)
    try:
        return (torch.backends.mkldnn.is_available() and ops is not None
                and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"))
    except (AttributeError, RuntimeError):
        return False


ONEDNN = _onednn_available()


class PreparedLinear(nn.Module):
    """Stands in for an nn.Linear: x W^T + b for x (..., in) -> (..., out), with W laid out once for inference.

    Called straight through `forward` (no nn.Module hook dispatch: it is a leaf of a decoding copy)."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None, onednn: bool = ONEDNN) -> None:
        super().__init__()
        with torch.inference_mode(False), torch.no_grad():                   # plain tensors, usable anywhere
            self.w = weight.detach().contiguous()                            # (out, in)
            self.b = None if bias is None else bias.detach().contiguous()    # (out,)
            self.out_features = self.w.size(0)
            wide = self.w.size(0) >= self.w.size(1) and self.w.device.type == "cpu"
            self.wt = self.w.t().contiguous() if wide else None              # (in, out) or None
            self.packed = None
            if onednn and self.w.device.type == "cpu" and self.w.dtype == torch.float32:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(self.w, PACK_BATCH_HINT)

    @classmethod
    def of(cls, linear: nn.Linear, onednn: bool = ONEDNN) -> PreparedLinear:
        return cls(linear.weight, linear.bias, onednn)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.size(-1))                                     # (rows, in)
        if self.packed is not None and rows.size(0) >= PACKED_MIN_ROWS and x.dtype == torch.float32:
            out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.b, "none", [], "")
        elif self.wt is None:
            out = F.linear(rows, self.w, self.b)
        elif self.b is None:
            out = torch.mm(rows, self.wt)
        else:
            out = torch.addmm(self.b, rows, self.wt)                         # (rows, out)
        return out.view(*x.shape[:-1], self.out_features)                   # (..., out)

    __call__ = forward
