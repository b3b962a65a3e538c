"""Precision as a decoding option: a float32 model turned into a bfloat16 or int8 copy for translation.

    fast = with_precision(model, "int8")        # a transformed copy; `model` is untouched, still float32
    memory = fast.encode(src, src_pad)          # the same class and API: encode, new_cache, decode_step
    logits = fast.decode_step(tokens, memory, src_pad, cache)

- float32: the reference; nothing to transform, the model itself is returned.
- bfloat16: every nn.Linear multiplies in bfloat16 on a bf16 copy of its weights (made once, not per call as
  autocast would), its output cast back to float32: the residual stream, LayerNorm, softmax, the embeddings and
  the logits stay float32 (bf16 keeps 8 bits of mantissa, which would round the residual at every layer).
- int8: every nn.Linear multiplies int8 weights, one scale per output channel, by its input quantised on the fly
  (one scale per row, symmetric; torchao's `Int8DynamicActivationInt8WeightConfig` is the same scheme), summed in
  int32 by `torch._int_mm` (VNNI / AMX-INT8 kernels where the CPU has them); the rest stays float32, as above.

The glass box keeps the float32 model. `cpu_precision_support()` reads the CPU's instructions,
`precision_note(dtype)` says in one line when a precision is likely slower than float32 here.
"""

from __future__ import annotations

import copy
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import UsageError
from .prepare import streamline

DTYPES = ("float32", "bfloat16", "int8")

BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")                 # x86: AVX-512-BF16, AMX-BF16; Arm: BF16
INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8", "i8mm", "asimddp")   # x86: VNNI, AMX-INT8; Arm: I8MM, DOT
REPORTED_FLAGS = ("avx2", "avx512f", *BF16_FLAGS, *INT8_FLAGS)


def check_dtype(dtype: str) -> str:
    """`dtype` if it is one of DTYPES, else a UsageError naming the choices."""
    if dtype not in DTYPES:
        raise UsageError(f"dtype: {dtype!r} is not one of {', '.join(DTYPES)}", "dtype")
    return dtype


# ---- what the CPU offers --------------------------------------------------------------------------
@dataclass(frozen=True)
class CpuSupport:
    """The CPU's vector level as torch dispatches it, and which precision-relevant flags it has."""

    capability: str                  # torch.backends.cpu.get_cpu_capability(): "AVX2", "AVX512", ...
    flags: frozenset[str]            # the REPORTED_FLAGS present
    flags_known: bool                # False where /proc/cpuinfo could not be read (not Linux)

    @property
    def bf16(self) -> bool:
        return any(f in self.flags for f in BF16_FLAGS)

    @property
    def int8(self) -> bool:
        return any(f in self.flags for f in INT8_FLAGS)

    @property
    def amx(self) -> bool:
        return "amx_bf16" in self.flags or "amx_int8" in self.flags

    def as_dict(self) -> dict:
        return {"capability": self.capability, "flags": sorted(self.flags), "flags_known": self.flags_known,
                "bf16": self.bf16, "int8": self.int8, "amx": self.amx}


def cpu_flags(text: str) -> frozenset[str]:
    """The REPORTED_FLAGS named on the `flags` (x86) or `Features` (Arm) lines of /proc/cpuinfo text."""
    found: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            found.update(value.split())
    return frozenset(f for f in REPORTED_FLAGS if f in found)


@functools.cache
def cpu_precision_support(cpuinfo: str = "/proc/cpuinfo") -> CpuSupport:
    """torch's CPU capability and the CPU's bf16/int8 instruction flags (read once)."""
    capability = torch.backends.cpu.get_cpu_capability()
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return CpuSupport(capability, frozenset(), False)
    return CpuSupport(capability, cpu_flags(text), True)


def precision_note(dtype: str, support: CpuSupport | None = None, subject: str = "it") -> str | None:
    """One line when the CPU lacks the instructions that make `dtype` pay, else None; `subject`: what is slower."""
    check_dtype(dtype)
    support = cpu_precision_support() if support is None else support
    if dtype == "float32" or not support.flags_known:
        return None
    if dtype == "bfloat16" and not support.bf16:
        return (f"note: bfloat16 on a CPU without AVX-512-BF16 or AMX (torch: {support.capability}): "
                f"expect {subject} slower than float32")
    if dtype == "int8" and not support.int8:
        return (f"note: int8 on a CPU without VNNI or AMX-INT8 (torch: {support.capability}): "
                "expect little or no gain over float32")
    return None


# ---- the transformations ----------------------------------------------------------------------------
class BFloat16Linear(nn.Module):
    """Stands in for an nn.Linear: x W^T + b multiplied in bfloat16, the result back in x's dtype."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", linear.weight.detach().to(torch.bfloat16))         # (out, in)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(torch.bfloat16))  # (out,)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x.to(torch.bfloat16), self.weight, self.bias).to(x.dtype)       # (..., out)


def _swap_linears(model: nn.Module, make) -> None:
    linears = [(p, n, c) for p in list(model.modules()) for n, c in p.named_children() if isinstance(c, nn.Linear)]
    for parent, name, child in linears:
        setattr(parent, name, make(child))


class Int8Linear(nn.Module):
    """Stands in for an nn.Linear: W in int8 with one scale per output channel (max |w| / 127), x quantised per row
    the same way at each call, the int8 product summed in int32 (`torch._int_mm`), then scaled back, plus b."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()                                               # (out, in)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("scale", w.abs().amax(dim=1).clamp_min(1e-12) / 127)         # (out,)
        quantised = torch.round(w / self.scale[:, None]).to(torch.int8)                   # (out, in)
        self.register_buffer("weight_t", quantised.t().contiguous())                      # (in, out): _int_mm's
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())  # (out,)

    @property
    def weight(self) -> Tensor:
        return self.weight_t.t()                                                          # (out, in) int8, a view

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.size(-1)).float()                                          # (rows, in)
        scale = rows.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127              # (rows, 1)
        out = torch._int_mm(torch.round(rows / scale).to(torch.int8), self.weight_t)      # (rows, out) int32
        out = out.float() * (scale * self.scale) + (0 if self.bias is None else self.bias)
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)                     # (..., out)


def with_precision(model: nn.Module, dtype: str, note: bool = True) -> nn.Module:
    """`model` decoding at `dtype` ("float32" | "bfloat16" | "int8"): a transformed copy in eval mode with
    the same encode / new_cache / decode_step; float32 returns `model` itself. With `note`, the line of
    `precision_note` goes to stderr (once per dtype and process) when the CPU lacks the instructions."""
    check_dtype(dtype)
    if dtype == "float32":
        return model
    device = next(model.parameters()).device
    if dtype == "int8" and device.type != "cpu":
        raise UsageError(f"dtype: int8 decoding runs on the CPU, the model is on {device.type}", "dtype")
    if note and device.type == "cpu":
        _note_once(dtype)
    copied = copy.deepcopy(model).eval().requires_grad_(False)
    _swap_linears(copied, BFloat16Linear if dtype == "bfloat16" else Int8Linear)
    copied.precision = dtype          # the float32 fast path (prepare) must leave this copy alone
    return streamline(copied)         # hook points inert, modules called straight through forward


def precision_of(model: nn.Module) -> str:
    """"bfloat16" or "int8" for a copy made by with_precision, else "float32"."""
    return getattr(model, "precision", "float32")


@functools.cache
def _note_once(dtype: str) -> None:
    if line := precision_note(dtype):
        print(line, file=sys.stderr)
