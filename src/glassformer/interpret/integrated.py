"""The path integral of integrated gradients: node scores, quadrature rules, the completeness error, auto steps.

Row r's score for input position i is Σ_d (e − e')_i,d · ∫₀¹ ∂f_r/∂e_i,d(e' + α(e − e')) dα. Its dot product
with (e − e') is taken at every node, so a node is one number per position (not a d-vector), and any rule
is a weighted sum of node scores. Summed over positions, a node's scores are df/dα, so the row's total is
the rule's value of ∫₀¹ df/dα dα, and completeness (total = f(e) − f(e') = delta) measures the rule's
error on that integral:

    error = |total − delta| / max(|delta|, DELTA_FLOOR)

DELTA_FLOOR (0.01 nats) keeps a row whose f barely moves (|delta| < 0.01) from dividing by ~0: there the
error is the absolute gap in units of 0.01 nats, so a 1 % tolerance means |total − delta| ≤ 1e-4.

Rules (docs/attribution.md has the error per forward pass on a trained model):
- "trapezoid": the trapezoid rule on `steps` equal intervals, nodes α = 0, 1/steps, … 1 (steps + 1
  passes per row; the points of Captum's "riemann_trapezoid" with steps + 1 points, whose weights sum to
  steps / (steps + 1) instead of 1). Nested: doubling the intervals
  keeps every earlier node and runs only the new midpoints.
- "gauss-legendre": `steps` Gauss–Legendre nodes on (0, 1); not nested, each count runs afresh.

Auto steps: start at START_STEPS, double until every row's error is within the tolerance, or until the
next count would pass MAX_IG_AUTO_STEPS or the pass budget (attribution.pass_budget); a row that converged
keeps its scores and is not run again. A word of several pieces converges as one (its pieces' sums).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .. import limits
from ..errors import UsageError

RULES = ("trapezoid", "gauss-legendre")
DEFAULT_RULE = "trapezoid"
DEFAULT_TOLERANCE = 0.01        # 1 %: the completeness docs/attribution.md promises
DELTA_FLOOR = 1e-2              # nats: below this |delta| the error is absolute (see the module docstring)
START_STEPS = 16                # auto: the first steps, doubled from there
CHUNK = 128                     # sentence copies per forward/backward pass (memory, not results)


@dataclass
class Path:
    """One sentence's straight path: inputs x and baseline b at both hook points, the rows and their f."""

    model: object
    src: Tensor                 # (1, src) ids
    tgt_in: Tensor              # (1, tgt) ids
    src_pad: Tensor             # (1, src) True = PAD
    x: tuple[Tensor, Tensor]    # (1, src, d), (1, tgt, d) embeddings at the input
    b: tuple[Tensor, Tensor]    # the same at the baseline
    rows: Tensor                # (rows,) target row of each f
    tokens: Tensor              # (rows,) the token whose log p is f
    contrast: Tensor | None     # (rows,) contrast token, < 0: none at that row


def objective(logits: Tensor, rows: Tensor, tokens: Tensor, contrast: Tensor | None) -> Tensor:
    """f for each copy b: log p(tokens[b]) at row rows[b] (− log p(contrast[b]) where contrast[b] ≥ 0)."""
    at = torch.arange(logits.size(0), device=logits.device)
    logp = torch.log_softmax(logits[at, rows].double(), dim=-1)             # (copies, vocab)
    f = logp[at, tokens]
    if contrast is not None:
        f = f - torch.where(contrast >= 0, logp[at, contrast.clamp(min=0)], torch.zeros_like(f))
    return f


def run(model, src: Tensor, tgt_in: Tensor, src_pad: Tensor, e_src: Tensor, e_tgt: Tensor) -> Tensor:
    """Logits with the embeddings replaced by e_src (copies, src, d) and e_tgt (copies, tgt, d)."""
    n = e_src.size(0)
    with model.intervene({"encoder.embedding": lambda v, name: e_src, "decoder.embedding": lambda v, name: e_tgt}):
        return model(src.expand(n, -1), tgt_in.expand(n, -1), src_pad.expand(n, -1))   # (copies, tgt, vocab)


def node_scores(path: Path, which: Tensor, alphas: Tensor, kind: str = "dot") -> tuple[Tensor, Tensor]:
    """Scores of rows path.rows[which] at nodes `alphas` (k,): (n, k, src) and (n, k, tgt), float64.

    kind "dot": Σ_d (e − e') · ∂f/∂e at e' + α(e − e'); kind "abs": Σ_d |∂f/∂e| (saliency)."""
    (x_src, x_tgt), (b_src, b_tgt) = path.x, path.b
    n, k = len(which), len(alphas)
    row_of = path.rows[which].repeat_interleave(k)                          # copy c = (row c // k, node c % k)
    token_of = path.tokens[which].repeat_interleave(k)
    contrast_of = path.contrast[which].repeat_interleave(k) if path.contrast is not None else None
    alpha_of = alphas.to(x_src.device).repeat(n)
    d_src, d_tgt = (x_src - b_src).double(), (x_tgt - b_tgt).double()       # (1, src, d), (1, tgt, d)
    s_src = torch.zeros(n * k, x_src.size(1), dtype=torch.float64, device=x_src.device)
    s_tgt = torch.zeros(n * k, x_tgt.size(1), dtype=torch.float64, device=x_src.device)
    for start in range(0, n * k, CHUNK):
        part = slice(start, start + CHUNK)
        a = alpha_of[part].to(x_src.dtype)[:, None, None]                   # (copies, 1, 1)
        e_src = (b_src + a * (x_src - b_src)).requires_grad_()              # e' + α(e − e'), (copies, src, d)
        e_tgt = (b_tgt + a * (x_tgt - b_tgt)).requires_grad_()
        with torch.enable_grad():
            f = objective(run(path.model, path.src, path.tgt_in, path.src_pad, e_src, e_tgt), row_of[part],
                          token_of[part], contrast_of[part] if contrast_of is not None else None)
            g_src, g_tgt = torch.autograd.grad(f.sum(), (e_src, e_tgt))     # each copy's own gradient
        if kind == "abs":
            s_src[part], s_tgt[part] = g_src.double().abs().sum(-1), g_tgt.double().abs().sum(-1)
        else:
            s_src[part], s_tgt[part] = (d_src * g_src.double()).sum(-1), (d_tgt * g_tgt.double()).sum(-1)
    return s_src.reshape(n, k, -1), s_tgt.reshape(n, k, -1)


def gauss_legendre(steps: int) -> tuple[Tensor, Tensor]:
    """Nodes α in (0, 1) and weights (summing to 1) for ∫₀¹ g(α) dα ≈ Σ w g(α)."""
    x, w = np.polynomial.legendre.leggauss(steps)
    return torch.from_numpy((x + 1) / 2), torch.from_numpy(w / 2)


def trapezoid(nodes: Tensor, steps: int) -> tuple[Tensor, Tensor]:
    """Nodes α = i/steps (i in `nodes`, 0 ≤ i ≤ steps) and their trapezoid weights (ends halved)."""
    w = torch.where((nodes == 0) | (nodes == steps), 0.5, 1.0).double() / steps
    return nodes.double() / steps, w


def rule_nodes(rule: str, steps: int) -> tuple[Tensor, Tensor]:
    """The nodes α and weights of `rule` at `steps` (every node is one forward-backward pass per row)."""
    if rule == "gauss-legendre":
        return gauss_legendre(steps)
    return trapezoid(torch.arange(steps + 1), steps)


def passes_per_row(rule: str, steps: int) -> int:
    return steps + 1 if rule == "trapezoid" else steps


def check_rule(rule: str) -> None:
    if rule not in RULES:
        raise UsageError(f"rule: expected one of {', '.join(RULES)}, got {rule!r}", "rule")


def check_tolerance(tolerance, field: str = "tolerance") -> None:
    ok = isinstance(tolerance, int | float) and not isinstance(tolerance, bool) and math.isfinite(tolerance)
    if not ok or not 0 < tolerance < 1:
        raise UsageError(f"{field}: expected a number between 0 and 1 (0.01 = 1 %), got {tolerance!r}", field)


def row_errors(total: Tensor, delta: Tensor) -> Tensor:
    """|total − delta| / max(|delta|, DELTA_FLOOR) per row (see the module docstring)."""
    return (total - delta).abs() / delta.abs().clamp(min=DELTA_FLOOR)


@dataclass
class Integral:
    """Integrated-gradients scores (rows, src), (rows, tgt) and, per row, its steps and the passes run."""

    source: Tensor
    prefix: Tensor
    steps: Tensor               # (rows,) the rule's steps that gave the row's scores
    passes: Tensor              # (rows,) forward-backward passes run for the row, all counts together


def fixed(path: Path, steps: int, rule: str) -> Integral:
    """Every row at `steps` of `rule`."""
    alphas, weights = rule_nodes(rule, steps)
    s_src, s_tgt = node_scores(path, torch.arange(len(path.rows)), alphas)
    w = weights[None, :, None]
    return Integral((w * s_src).sum(1).cpu(), (w * s_tgt).sum(1).cpu(), torch.full((len(path.rows),), steps),
                    torch.full((len(path.rows),), len(alphas)))


def grouped_errors(source: Tensor, prefix: Tensor, delta: Tensor, group: Tensor) -> Tensor:
    """Each row's error as the error of its group (a word: the sum of its pieces' rows)."""
    k = int(group.max()) + 1
    total = torch.zeros(k, dtype=torch.float64).index_add_(0, group, source.sum(1) + prefix.sum(1))
    gap = row_errors(total, torch.zeros(k, dtype=torch.float64).index_add_(0, group, delta))
    return gap[group]


def auto(path: Path, delta: Tensor, rule: str, tolerance: float, budget: int, group: Tensor | None = None) -> Integral:
    """Double the steps from START_STEPS until every row is within `tolerance` (all passes ≤ budget).

    delta: (rows,) f(e) − f(e'); group: (rows,) the word of each row (default: each row its own)."""
    rows = len(path.rows)
    group = torch.arange(rows) if group is None else group
    source = torch.zeros(rows, path.x[0].size(1), dtype=torch.float64)
    prefix = torch.zeros(rows, path.x[1].size(1), dtype=torch.float64)
    steps, passes = torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.long)
    open_, n, spent = torch.arange(rows), START_STEPS, 0
    while len(open_) and n <= limits.MAX_IG_AUTO_STEPS:
        nested = rule == "trapezoid" and spent > 0                          # reuse the n/2 grid: run odd i only
        new = torch.arange(1, n + 1, 2) if nested else torch.arange(0 if rule == "trapezoid" else 1, n + 1)
        if spent and spent + len(open_) * len(new) > budget:
            break
        alphas, weights = trapezoid(new, n) if rule == "trapezoid" else gauss_legendre(n)
        s_src, s_tgt = node_scores(path, open_, alphas)
        w = weights[None, :, None]
        add_src, add_tgt = (w * s_src).sum(1).cpu(), (w * s_tgt).sum(1).cpu()   # (open, src), (open, tgt)
        keep = 0.5 if nested else 0.0                                       # T_n = T_(n/2) / 2 + the midpoints
        source[open_], prefix[open_] = keep * source[open_] + add_src, keep * prefix[open_] + add_tgt
        steps[open_], passes[open_], spent = n, passes[open_] + len(new), spent + len(open_) * len(new)
        err = grouped_errors(source, prefix, delta, group)
        open_ = open_[err[open_] > tolerance]
        n *= 2
    return Integral(source, prefix, steps, passes)
