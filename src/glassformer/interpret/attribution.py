"""Why *him*: how much each source unit and each earlier target token contributes to one target row.

For target row t (teacher-forced, or the greedy output fed back) the quantity is

    f_t = log p(y_t | source, y_<t)                      or, with a contrast word c,
    f_t = log p(y_t | ...) − log p(c | ...)              ("why him and not her")

and every method gives one score per source unit and per target input 0..t (BOS, y_1 .. y_t):

- saliency: Σ_d |∂f/∂e|, the gradient's size at each embedding (unsigned);
- input-x-gradient: Σ_d e · ∂f/∂e (signed; first-order share of f);
- integrated-gradients: Σ_d (e − e') · ∫₀¹ ∂f/∂e(e' + α(e − e')) dα from a baseline e', the integral by a
  quadrature rule (integrated.py: the trapezoid by default, or Gauss–Legendre). Completeness: the scores of
  a row sum to f(e) − f(e') (`delta`); each row's error |Σ − delta| / |delta| is returned, and `steps="auto"`
  doubles the steps until every row is within the tolerance.
  The baseline is the position-only embedding: every token vector removed, each position's sinusoidal
  vector kept (source and target alike). Not the zero embedding: LayerNorm is scale-invariant, so f(αe)
  is flat for α > 0 and jumps at α ≈ 0, and no step count integrates that (measured: completeness off
  by more than 100 % at 256 steps). Models without a sinusoidal table (learned, RoPE, relative, no
  positions) use the PAD token's embedding at every position instead (`baseline_name` says which);
- attention: the cross-attention weights (source) and masked self-attention weights (prefix) of the row,
  averaged over every decoder layer and head; they do not depend on the predicted token (no contrast);
- alti: ALTI+ token contributions (alti.py): every attention block with its residual and LayerNorm split
  token by token, each token's share c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁) normalised, composed over the
  layers; non-negative, summing to 1 per row, independent of the predicted token (no contrast).

The source share of a row (`source_share`): alti Σ source (the rest is the prefix's); gradient methods
Σ|source| / (Σ|source| + Σ|prefix|); attention none (its cross and self weights each sum to 1 on their own).

e is the value at the hook points `encoder.embedding` / `decoder.embedding` (token × √d + position). The
integrated-gradients batch holds rows × nodes copies of the sentence, one backward pass per chunk: every
copy's f depends on its own embeddings only, so the gradient of Σ f is each copy's own gradient.

The methods are a few lines on `model.intervene`; Captum's IntegratedGradients (same nodes) agrees with
them (tests/test_attribution.py, when captum is installed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .. import limits
from ..errors import UsageError
from ..model import sinusoidal_positions
from . import alti, integrated
from .integrated import DEFAULT_RULE, DEFAULT_TOLERANCE, Path, node_scores, objective, run
from .methods import METHODS

GRADIENT_METHODS = METHODS[:3]
DEFAULT_METHOD = "integrated-gradients"
AUTO = "auto"                   # steps: doubled until every row is complete within the tolerance
DEFAULT_STEPS = AUTO


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

    `value` is f at the input; integrated gradients only: `baseline` f at the baseline embedding, `error`
    |Σ − (value − baseline)| / max(|value − baseline|, DELTA_FLOOR), `steps` the rule's steps and
    `passes` the forward-backward passes spent on the row."""

    source: Tensor
    prefix: Tensor
    value: Tensor
    baseline: Tensor | None
    error: Tensor | None = None
    steps: Tensor | None = None
    passes: Tensor | None = None


def check_steps(steps, field: str = "steps") -> None:
    """`steps` is AUTO or a whole number 1 … MAX_IG_STEPS."""
    if steps == AUTO:
        return
    if not isinstance(steps, int) or isinstance(steps, bool):
        raise UsageError(f"{field}: expected an integer number of steps or {AUTO!r}, got {steps!r}", field)
    if steps < 1:
        raise UsageError(f"{field}: expected at least 1 step, got {steps}", field)
    limits.check(f"{field}: integrated-gradients steps", steps, "MAX_IG_STEPS", field)


def check_passes(rows: int, steps, rule: str = DEFAULT_RULE, field: str = "steps", positions: int = 0) -> None:
    """rows × the passes of one row (auto: of its first count) within MAX_ATTRIBUTION_PASSES and, times the
    sentence's `positions` (source + target, where known), within MAX_ATTRIBUTION_POSITIONS."""
    first = integrated.START_STEPS if steps == AUTO else steps
    passes = rows * integrated.passes_per_row(rule, first)
    limits.check("rows × integrated-gradients passes", passes, "MAX_ATTRIBUTION_PASSES", field)
    limits.check(f"rows × integrated-gradients passes × {positions} positions", passes * positions,
                 "MAX_ATTRIBUTION_POSITIONS", field)


def pass_budget(positions: int) -> int:
    """The passes one attribution of a sentence of `positions` (source + target) may run: MAX_ATTRIBUTION_PASSES,
    fewer for a long sentence (MAX_ATTRIBUTION_POSITIONS: a pass's time grows with its positions)."""
    return min(limits.MAX_ATTRIBUTION_PASSES, limits.MAX_ATTRIBUTION_POSITIONS // max(positions, 1))


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


def gradient_attribution(model, src: Tensor, tgt_in: Tensor, rows: list[int], tokens: list[int],
                         method: str = DEFAULT_METHOD, contrast: list[int] | None = None,
                         steps: int | str = DEFAULT_STEPS, src_pad: Tensor | None = None, rule: str = DEFAULT_RULE,
                         tolerance: float = DEFAULT_TOLERANCE, group: list[int] | None = None) -> Attribution:
    """Scores for rows `rows` predicting `tokens` (contrast[k] < 0: no contrast at that row).

    src: (1, src) ids, tgt_in: (1, tgt) right-shifted target ids, src_pad: (1, src) True = PAD;
    group: (integrated gradients, auto) the word of each row, which converges as one.
    """
    if method not in GRADIENT_METHODS:
        raise UsageError(f"method: expected one of {', '.join(GRADIENT_METHODS)}, got {method!r}", "method")
    _check_rows(rows, tgt_in)
    integrated.check_rule(rule)
    integrated.check_tolerance(tolerance)
    model.eval()
    src_pad = model.source_padding(src) if src_pad is None else src_pad
    with torch.no_grad(), model.probes("encoder.embedding", "decoder.embedding") as rec:
        model(src, tgt_in, src_pad)
    x = (rec["encoder.embedding"], rec["decoder.embedding"])               # (1, src, d), (1, tgt, d)
    device = x[0].device
    ids = (torch.tensor(rows, device=device), torch.tensor(tokens, device=device),
           torch.tensor(contrast, device=device) if contrast is not None else None)
    if method != "integrated-gradients":
        path = Path(model, src, tgt_in, src_pad, x, (torch.zeros_like(x[0]), torch.zeros_like(x[1])), *ids)
        one = torch.ones(1, dtype=torch.float64)
        source, prefix = node_scores(path, torch.arange(len(rows)), one, "abs" if method == "saliency" else "dot")
        value, _ = _values(model, src, tgt_in, src_pad, x, None, rows, tokens, contrast)
        return Attribution(source[:, 0].cpu(), prefix[:, 0].cpu(), value.cpu(), None)
    check_steps(steps)
    check_passes(len(rows), steps, rule, positions=src.size(1) + tgt_in.size(1))
    b = baseline_embeddings(model, src, tgt_in)
    path = Path(model, src, tgt_in, src_pad, x, b, *ids)
    value, baseline = _values(model, src, tgt_in, src_pad, x, b, rows, tokens, contrast)
    delta = (value - baseline).cpu()
    if steps == AUTO:
        lifted = len(rows) * 2 * (limits.MAX_IG_AUTO_STEPS + 1)            # --no-limits: auto's own bound
        budget = pass_budget(src.size(1) + tgt_in.size(1)) if limits.enforced() else lifted
        out = integrated.auto(path, delta, rule, tolerance, budget, torch.tensor(group) if group else None)
    else:
        out = integrated.fixed(path, steps, rule)
    error = integrated.row_errors(out.source.sum(1) + out.prefix.sum(1), delta)
    return Attribution(out.source, out.prefix, value.cpu(), baseline.cpu(), error, out.steps, out.passes)


@torch.no_grad()
def _values(model, src, tgt_in, src_pad, inputs, baselines, rows, tokens, contrast):
    """f at the input embeddings (and at the baseline embeddings) for each row."""
    device = src.device
    r, t = torch.tensor(rows, device=device), torch.tensor(tokens, device=device)
    c = torch.tensor(contrast, device=device) if contrast is not None else None

    def f(embeddings):
        return objective(run(model, src, tgt_in, src_pad, *embeddings).expand(len(rows), -1, -1), r, t, c)
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


def alti_attribution(model, src: Tensor, tgt_in: Tensor, rows: list[int],
                     src_pad: Tensor | None = None) -> Attribution:
    """ALTI+ contributions of each row: source (rows, src) and prefix (rows, tgt), together summing to 1."""
    _check_rows(rows, tgt_in)
    m = alti.alti_contributions(model, src, tgt_in, src_pad)               # (tgt, src + tgt)
    r = torch.tensor(rows, dtype=torch.long)
    value = torch.full((len(rows),), float("nan"), dtype=torch.float64)
    return Attribution(m[r, : src.size(1)], m[r, src.size(1):], value, None)


def _check_rows(rows: list[int], tgt_in: Tensor) -> None:
    if any(not 0 <= r < tgt_in.size(1) for r in rows):
        raise UsageError(f"row: outside the target input of {tgt_in.size(1)} positions", "row")


def source_share(source: Tensor, prefix: Tensor, method: str) -> float | None:
    """The share of one row's scores that comes from the source: source (src,), prefix (tgt,).

    alti: Σ source (the row sums to 1); gradient methods: Σ|source| / (Σ|source| + Σ|prefix|), None when every
    score is 0; attention: None (cross and self weights each sum to 1 on their own)."""
    if method == "alti":
        return min(1.0, max(0.0, float(source.sum())))
    if method == "attention":
        return None
    s, p = float(source.abs().sum()), float(prefix.abs().sum())
    return s / (s + p) if s + p > 0 else None


def source_shares(model, src: Tensor, tgt_in: Tensor, labels: list[int], method: str = "alti") -> list[float]:
    """The source share of every target row 0 … len(labels) − 1 of one sentence (pieces, not words).

    src (1, src) and tgt_in (1, tgt) ids, labels[r] the token row r predicts. alti: one recording pass for all
    rows; a gradient method: its attribution of every row (integrated gradients at its default auto steps)."""
    if method == "attention":
        raise UsageError("method: attention has no source share (its cross and self weights each sum to 1); "
                         "use alti or a gradient method", "method")
    if method not in METHODS:
        raise UsageError(f"method: expected one of {', '.join(METHODS)}, got {method!r}", "method")
    rows = list(range(len(labels)))
    a = attribute(model, src, tgt_in, rows, list(labels), method)
    return [source_share(a.source[r], a.prefix[r], method) for r in rows]


def attribute(model, src: Tensor, tgt_in: Tensor, rows: list[int], tokens: list[int], method: str = DEFAULT_METHOD,
              contrast: list[int] | None = None, steps: int | str = DEFAULT_STEPS, src_pad: Tensor | None = None,
              rule: str = DEFAULT_RULE, tolerance: float = DEFAULT_TOLERANCE,
              group: list[int] | None = None) -> Attribution:
    """Any method of METHODS (see the module docstring)."""
    if method == "attention":
        if contrast is not None:
            raise UsageError("contrast: the attention method reads weights, which do not depend on the predicted "
                             "token; use a gradient method for a contrast", "contrast")
        return attention_attribution(model, src, tgt_in, rows, src_pad)
    if method == "alti":
        if contrast is not None:
            raise UsageError("contrast: alti splits each row's vector among its inputs, whatever token it predicts; "
                             "use a gradient method for a contrast", "contrast")
        return alti_attribution(model, src, tgt_in, rows, src_pad)
    return gradient_attribution(model, src, tgt_in, rows, tokens, method, contrast, steps, src_pad, rule, tolerance,
                                group)
