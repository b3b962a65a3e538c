"""Why *him*: how much each source unit and each earlier target token contributes to one target row.

For target row t (teacher-forced, or the greedy output fed back) the quantity is

    f_t = log p(y_t | source, y_<t)                      or, with a contrast word c,
    f_t = log p(y_t | ...) − log p(c | ...)              ("why him and not her")

and every method gives one score per source unit and per target input 0..t (BOS, y_1 .. y_t):

- saliency: Σ_d |∂f/∂e|, the gradient's size at each embedding (unsigned);
- input-x-gradient: Σ_d e · ∂f/∂e (signed; first-order share of f);
- integrated-gradients: Σ_d (e − e') · ∫₀¹ ∂f/∂e(e' + α(e − e')) dα from a baseline e', the integral by
  Gauss–Legendre with `steps` nodes. Completeness: the scores of a row sum to f(e) − f(e') (`delta`).
  The baseline is the position-only embedding: every token vector removed, each position's sinusoidal
  vector kept (source and target alike). Not the zero embedding: LayerNorm is scale-invariant, so f(αe)
  is flat for α > 0 and jumps at α ≈ 0, and no step count integrates that (measured: completeness off
  by more than 100 % at 256 steps). Models without a sinusoidal table (learned, RoPE, relative, no
  positions) use the PAD token's embedding at every position instead (`baseline_name` says which);
- attention: the cross-attention weights (source) and masked self-attention weights (prefix) of the row,
  averaged over every decoder layer and head; they do not depend on the predicted token (no contrast).

e is the value at the hook points `encoder.embedding` / `decoder.embedding` (token × √d + position). The
integrated-gradients batch holds rows × steps copies of the sentence and needs one backward pass: every
copy's f depends on its own embeddings only, so the gradient of Σ f is each copy's own gradient.

The methods are a few lines on `model.intervene`; Captum's IntegratedGradients (same nodes) agrees with
them (tests/test_attribution.py, when captum is installed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .. import limits
from ..errors import UsageError
from ..model import sinusoidal_positions

METHODS = ("saliency", "input-x-gradient", "integrated-gradients", "attention")
GRADIENT_METHODS = METHODS[:3]
DEFAULT_METHOD = "integrated-gradients"
DEFAULT_STEPS = 128             # Gauss–Legendre nodes (completeness by steps: docs/attribution.md)
CHUNK = 128                     # sentence copies per forward/backward pass (memory, not results)


@dataclass(frozen=True)
class Specials:
    """The target side's special ids, in one place."""

    bos: int
    eos: int
    pad: int


def special_ids(model) -> Specials:
    """BOS / EOS / PAD of `model` (its config's ids: an imported Marian model starts from its PAD id)."""
    cfg = model.cfg
    return Specials(cfg.bos_id, cfg.eos_id, cfg.pad_id)


@dataclass
class Attribution:
    """Per target row r: scores over the source (rows, src) and over the target inputs (rows, tgt).

    `value` is f at the input; `baseline` f at the baseline embedding (integrated gradients only)."""

    source: Tensor
    prefix: Tensor
    value: Tensor
    baseline: Tensor | None


def gauss_legendre(steps: int) -> tuple[Tensor, Tensor]:
    """Nodes α in (0, 1) and weights (summing to 1) for ∫₀¹ g(α) dα ≈ Σ w g(α)."""
    x, w = np.polynomial.legendre.leggauss(steps)
    return torch.from_numpy((x + 1) / 2), torch.from_numpy(w / 2)


def check_steps(steps: int, field: str = "steps") -> None:
    if steps < 1:
        raise UsageError(f"{field}: expected at least 1 step, got {steps}", field)
    limits.check(f"{field}: integrated-gradients steps", steps, "MAX_IG_STEPS", field)


def baseline_name(model) -> str:
    """Which integrated-gradients baseline `model` gets (see the module docstring)."""
    return "position-only" if model.cfg.positions == "sinusoidal" else "pad-token"


@torch.no_grad()
def baseline_embeddings(model, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
    """e' for the source (1, src, d) and the target inputs (1, tgt, d)."""
    cfg = model.cfg
    if baseline_name(model) == "position-only":
        table = sinusoidal_positions(cfg.max_len, cfg.d_model, torch.float64, cfg.position_layout)
        like = next(model.parameters())
        table = table.to(device=like.device, dtype=like.dtype)
        return table[: src.size(1)][None], table[: tgt_in.size(1)][None]
    pad = special_ids(model).pad
    with model.probes("encoder.embedding", "decoder.embedding") as rec:    # nothing masked: PAD is the input
        model(torch.full_like(src, pad), torch.full_like(tgt_in, pad), torch.zeros_like(src, dtype=torch.bool))
    return rec["encoder.embedding"], rec["decoder.embedding"]


def _objective(logits: Tensor, rows: Tensor, tokens: Tensor, contrast: Tensor | None) -> Tensor:
    """f for each copy b: log p(tokens[b]) at row rows[b] (− log p(contrast[b]) where contrast[b] ≥ 0)."""
    at = torch.arange(logits.size(0), device=logits.device)
    logp = torch.log_softmax(logits[at, rows].double(), dim=-1)             # (copies, vocab)
    f = logp[at, tokens]
    if contrast is not None:
        f = f - torch.where(contrast >= 0, logp[at, contrast.clamp(min=0)], torch.zeros_like(f))
    return f


def _run(model, src: Tensor, tgt_in: Tensor, src_pad: Tensor, e_src: Tensor, e_tgt: Tensor) -> Tensor:
    """Logits with the embeddings replaced by e_src (copies, src, d) and e_tgt (copies, tgt, d)."""
    n = e_src.size(0)
    with model.intervene({"encoder.embedding": lambda v, name: e_src, "decoder.embedding": lambda v, name: e_tgt}):
        return model(src.expand(n, -1), tgt_in.expand(n, -1), src_pad.expand(n, -1))   # (copies, tgt, vocab)


def gradient_attribution(model, src: Tensor, tgt_in: Tensor, rows: list[int], tokens: list[int],
                         method: str = DEFAULT_METHOD, contrast: list[int] | None = None,
                         steps: int = DEFAULT_STEPS, src_pad: Tensor | None = None) -> Attribution:
    """Scores for rows `rows` predicting `tokens` (contrast[k] < 0: no contrast at that row).

    src: (1, src) ids, tgt_in: (1, tgt) right-shifted target ids, src_pad: (1, src) True = PAD.
    """
    if method not in GRADIENT_METHODS:
        raise UsageError(f"method: expected one of {', '.join(GRADIENT_METHODS)}, got {method!r}", "method")
    if any(not 0 <= r < tgt_in.size(1) for r in rows):
        raise UsageError(f"row: outside the target input of {tgt_in.size(1)} positions", "row")
    model.eval()
    src_pad = model.source_padding(src) if src_pad is None else src_pad
    with torch.no_grad(), model.probes("encoder.embedding", "decoder.embedding") as rec:
        model(src, tgt_in, src_pad)
    x_src, x_tgt = rec["encoder.embedding"], rec["decoder.embedding"]       # (1, src, d), (1, tgt, d)
    integrated = method == "integrated-gradients"
    if integrated:
        check_steps(steps)
        alphas, weights = gauss_legendre(steps)
        b_src, b_tgt = baseline_embeddings(model, src, tgt_in)
    else:
        alphas, weights = torch.ones(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
        b_src, b_tgt = torch.zeros_like(x_src), torch.zeros_like(x_tgt)
    k = len(alphas)
    # copy b = (row index b // k, node b % k)
    device = x_src.device
    row_of = torch.tensor(rows, device=device).repeat_interleave(k)
    token_of = torch.tensor(tokens, device=device).repeat_interleave(k)
    contrast_of = torch.tensor(contrast, device=device).repeat_interleave(k) if contrast is not None else None
    alphas, weights = alphas.to(device), weights.to(device)
    alpha_of = alphas.repeat(len(rows))
    g_src = torch.zeros(len(rows) * k, *x_src.shape[1:], dtype=torch.float64, device=device)
    g_tgt = torch.zeros(len(rows) * k, *x_tgt.shape[1:], dtype=torch.float64, device=device)
    for start in range(0, len(row_of), CHUNK):
        part = slice(start, start + CHUNK)
        a = alpha_of[part].to(x_src.dtype)[:, None, None]                   # (copies, 1, 1)
        e_src = (b_src + a * (x_src - b_src)).requires_grad_()              # e' + α(e − e'), (copies, src, d)
        e_tgt = (b_tgt + a * (x_tgt - b_tgt)).requires_grad_()
        with torch.enable_grad():
            f = _objective(_run(model, src, tgt_in, src_pad, e_src, e_tgt), row_of[part], token_of[part],
                           contrast_of[part] if contrast_of is not None else None)
            grad_src, grad_tgt = torch.autograd.grad(f.sum(), (e_src, e_tgt))
        g_src[part], g_tgt[part] = grad_src.double(), grad_tgt.double()
    w = weights.repeat(len(rows))[:, None, None]
    g_src = (w * g_src).reshape(len(rows), k, *x_src.shape[1:]).sum(1)     # (rows, src, d): ∫ ∂f/∂e dα
    g_tgt = (w * g_tgt).reshape(len(rows), k, *x_tgt.shape[1:]).sum(1)     # (rows, tgt, d)
    if method == "saliency":
        source, prefix = g_src.abs().sum(-1), g_tgt.abs().sum(-1)
    else:
        source = ((x_src - b_src).double() * g_src).sum(-1)                 # (rows, src)
        prefix = ((x_tgt - b_tgt).double() * g_tgt).sum(-1)                 # (rows, tgt)
    value, baseline = _values(model, src, tgt_in, src_pad, (x_src, x_tgt), (b_src, b_tgt) if integrated else None,
                              rows, tokens, contrast)
    return Attribution(source.cpu(), prefix.cpu(), value.cpu(), baseline.cpu() if baseline is not None else None)


@torch.no_grad()
def _values(model, src, tgt_in, src_pad, inputs, baselines, rows, tokens, contrast):
    """f at the input embeddings (and at the baseline embeddings) for each row."""
    device = src.device
    r, t = torch.tensor(rows, device=device), torch.tensor(tokens, device=device)
    c = torch.tensor(contrast, device=device) if contrast is not None else None

    def f(embeddings):
        return _objective(_run(model, src, tgt_in, src_pad, *embeddings).expand(len(rows), -1, -1), r, t, c)
    return f(inputs), (f(baselines) if baselines is not None else None)


@torch.no_grad()
def attention_attribution(model, src: Tensor, tgt_in: Tensor, rows: list[int],
                          src_pad: Tensor | None = None) -> Attribution:
    """Cross- and self-attention weights of each row, averaged over decoder layers and heads."""
    model.eval()
    src_pad = model.source_padding(src) if src_pad is None else src_pad
    with model.probes("decoder.*.cross_attention.head.*.weights", "decoder.*.self_attention.head.*.weights") as rec:
        logits = model(src, tgt_in, src_pad)
    cross = torch.stack([rec[n][0].cpu() for n in rec if ".cross_attention." in n])  # (layers·heads, tgt, src)
    self_ = torch.stack([rec[n][0].cpu() for n in rec if ".self_attention." in n])   # (layers·heads, tgt, tgt)
    r = torch.tensor(rows)
    value = torch.full((len(rows),), float("nan"), dtype=torch.float64)
    del logits
    return Attribution(cross.double().mean(0)[r], self_.double().mean(0)[r], value, None)


def attribute(model, src: Tensor, tgt_in: Tensor, rows: list[int], tokens: list[int], method: str = DEFAULT_METHOD,
              contrast: list[int] | None = None, steps: int = DEFAULT_STEPS,
              src_pad: Tensor | None = None) -> Attribution:
    """Any method of METHODS (see the module docstring)."""
    if method == "attention":
        if contrast is not None:
            raise UsageError("contrast: the attention method reads weights, which do not depend on the predicted "
                             "token; use a gradient method for a contrast", "contrast")
        return attention_attribution(model, src, tgt_in, rows, src_pad)
    return gradient_attribution(model, src, tgt_in, rows, tokens, method, contrast, steps, src_pad)
