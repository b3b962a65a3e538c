"""Chapter A, attention arithmetic: rows stay rows, shared projections, softmax along keys, scale first."""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import examples as ex
from ..reference import max_difference, run_reference
from ..spec import run_spec
from .common import EXACT, TOL, array, block, diff, np_softmax, seeded_model, source_ids
from .registry import Reading, check, reading


@check("A1", "rows stay rows: n×n scores and weights, n output rows")
def rows_stay_rows() -> Reading:
    model = seeded_model()
    shapes, ok = [], True
    for units in (ex.NINE_UNITS, ex.SIX_UNITS):
        with torch.no_grad(), model.probes("encoder.0.self_attention.head.0.scores",
                                           "encoder.0.self_attention.head.0.weights", "encoder.output") as trace:
            model.encode(source_ids(units))
        n, d = len(units), model.cfg.d_model
        s = trace["encoder.0.self_attention.head.0.scores"][0]
        w = trace["encoder.0.self_attention.head.0.weights"][0]
        y = trace["encoder.output"][0]
        distinct = float(torch.cdist(y, y).add(torch.eye(n, dtype=y.dtype)).min())
        ok &= tuple(s.shape) == (n, n) and tuple(w.shape) == (n, n) and tuple(y.shape) == (n, d) and distinct > 1e-3
        shapes.append({"units": n, "scores": list(s.shape), "weights": list(w.shape), "output": list(y.shape),
                       "closest_rows": distinct})
    a, b = shapes
    return reading("{a[units]} units: scores {a[scores][0]}×{a[scores][1]}, weights {a[weights][0]}×{a[weights][1]}, "
                   "output {a[output][0]}×{a[output][1]}; {b[units]} units: scores {b[scores][0]}×{b[scores][1]}, "
                   "weights {b[weights][0]}×{b[weights][1]}, output {b[output][0]}×{b[output][1]}", ok,
                   tolerance={"distinct_rows": 1e-3}, a=a, b=b)


@check("A2", "one W^Q, W^K, W^V shared by every position; Y = softmax(QKᵀ/√d_k)V")
def projections_shared() -> Reading:
    r = block()
    x = array(ex.X)
    worst_proj, worst_y = 0.0, 0.0
    for h, (wq, wk, wv) in enumerate(((ex.W_Q1, ex.W_K1, ex.W_V1), (ex.W_Q2, ex.W_K2, ex.W_V2))):
        head = r["self_attention"]["heads"][h]
        q, k, v = array(head["q"]), array(head["k"]), array(head["v"])
        worst_proj = max(worst_proj, diff(q, x @ array(wq)), diff(k, x @ array(wk)), diff(v, x @ array(wv)))
        worst_y = max(worst_y, diff(head["output"], np_softmax(q @ k.T / math.sqrt(q.shape[1])) @ v))
    return reading("max |Q−XW^Q|, |K−XW^K|, |V−XW^V| = {projections:Δ}; |Y − softmax(QKᵀ/√d_k)V| = {output:Δ}",
                   worst_proj <= EXACT and worst_y <= EXACT, tolerance={"exact": EXACT},
                   projections=worst_proj, output=worst_y)


@check("A3", "softmax along keys: rows sum to 1, columns need not")
def softmax_along_keys() -> Reading:
    tables = [array(h["weights"]) for h in block()["self_attention"]["heads"]]
    model = seeded_model()
    with torch.no_grad(), model.probes("encoder.*.self_attention.head.*.weights") as trace:
        model.encode(source_ids(ex.NINE_UNITS))
    tables += [t[0].numpy() for t in trace.records.values()]
    row_err = max(float(np.max(np.abs(w.sum(axis=1) - 1))) for w in tables)
    cols = np.concatenate([w.sum(axis=0) for w in tables])
    return reading("{tables} tables: max |row sum − 1| = {row_sum:Δ}; column sums {column_min:.3f}…{column_max:.3f}",
                   row_err <= EXACT and float(np.max(np.abs(cols - 1))) > 0.05,
                   tolerance={"exact": EXACT, "columns_differ": 0.05}, tables=len(tables), row_sum=row_err,
                   column_min=float(cols.min()), column_max=float(cols.max()))


@check("A4", "scale before softmax: QKᵀ, then ÷√d_k, then softmax")
def scale_before_softmax() -> Reading:
    heads = block()["self_attention"]["heads"]
    s, scaled, w = array(heads[0]["scores"]), array(heads[0]["scaled_scores"]), array(heads[0]["weights"])
    order = max(diff(scaled, s / math.sqrt(2)), diff(w, np_softmax(s / math.sqrt(2))))
    lesson = max(diff(heads[0]["output"][0], ex.BLOCK_ROW1["head1"]),
                 diff(heads[1]["output"][0], ex.BLOCK_ROW1["head2"]))
    return reading("scaled = QKᵀ/√2 and weights = softmax(scaled): |Δ| = {order:Δ}; "
                   "head outputs row 1 vs lesson |Δ| = {lesson:Δ}", order <= EXACT and lesson <= TOL,
                   tolerance={"exact": EXACT, "lesson": TOL}, order=order, lesson=lesson)


@check("A5", "the 2×3 exercise, unscaled: QKᵀ, A, AV as printed")
def exercise_unscaled() -> Reading:
    r = run_spec(ex.exercise_spec(scale=False))
    err = max(diff(r["scores"], ex.EXERCISE_SCORES), diff(r["weights"], ex.EXERCISE_WEIGHTS),
              diff(r["output"], ex.EXERCISE_OUTPUT))
    return reading("A row 1 = ({a[0]:.6f}, {a[1]:.6f}, {a[2]:.6f}), AV row 1 = ({av[0]:.6f}, {av[1]:.6f}); "
                   "max |Δ| vs lesson {lesson:Δ}", err <= TOL, tolerance={"lesson": TOL},
                   a=list(r["weights"][0]), av=list(r["output"][0]), lesson=err)


@check("A6", "the same exercise scaled (d_k = 2): 1 → 1/√2, weights change")
def exercise_scaled() -> Reading:
    r = run_spec(ex.exercise_spec(scale=True))
    one, zero = r["scaled_scores"][0][0], r["scaled_scores"][0][1]
    moved = abs(r["weights"][0][0] - ex.EXERCISE_WEIGHTS[0][0])
    independent = max_difference(r, run_reference(ex.exercise_spec(scale=True)))
    return reading("score 1 → {one:.6f}, 0 → {zero:g}; weight[1][1] {unscaled} → {weight:.6f}; "
                   "vs reference |Δ| = {reference:Δ}",
                   abs(one - ex.EXERCISE_SCALED_ONE) <= TOL and zero == 0 and moved > 1e-3 and independent <= EXACT,
                   tolerance={"lesson": TOL, "exact": EXACT, "weights_move": 1e-3}, one=one, zero=zero,
                   unscaled=ex.EXERCISE_WEIGHTS[0][0], weight=r["weights"][0][0], reference=independent)


@check("A7", "softmax attention is non-linear in X")
def attention_is_nonlinear() -> Reading:
    x = array(ex.X)
    x2 = array(np.random.default_rng(7).standard_normal(x.shape))
    mha = {name: array(block(x=v.tolist())["self_attention"]["output"])
           for name, v in (("x", x), ("2x", 2 * x), ("x2", x2), ("sum", x + x2))}
    q = {name: array(block(x=v.tolist())["self_attention"]["heads"][0]["q"]) for name, v in (("x", x), ("2x", 2 * x))}
    homogeneity = diff(mha["2x"], 2 * mha["x"])
    additivity = diff(mha["sum"], mha["x"] + mha["x2"])
    linear_q = diff(q["2x"], 2 * q["x"])
    return reading("|MHA(2X) − 2MHA(X)| = {homogeneity:.3f}, |MHA(X+X') − MHA(X) − MHA(X')| = {additivity:.3f} "
                   "(projections alone: {projections:Δ})",
                   homogeneity > 1e-2 and additivity > 1e-2 and linear_q <= EXACT,
                   tolerance={"nonlinear": 1e-2, "exact": EXACT}, homogeneity=homogeneity, additivity=additivity,
                   projections=linear_q)
