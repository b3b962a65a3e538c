"""One check per claim of the lesson (A1 … G2), computed with the model's own code.

Each check runs the project's layers (glassformer.model, or trace spec v1 on top of them) and
compares the result either with the number the lesson prints, with an independent formula
(reference.py, or a few lines of NumPy written out), or with a structural property. None of
them asserts the lesson's numbers against themselves. `glassformer verify` prints one row each.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import torch

from ..model.attention import MultiHeadAttention
from ..model.config import ModelConfig
from ..model.hooks import probes
from ..model.layers import DecoderLayer, EncoderLayer, ResidualNorm
from ..model.masks import causal_mask, combine, loss_mask, padding_mask
from ..model.positions import RotaryEmbedding, sinusoidal_positions
from ..model.transformer import DecoderOnlyModel, EncoderOnlyModel, Transformer, build_model
from . import examples as ex
from .reference import layer_norm, max_difference, run_reference
from .spec import run_spec

TOL = ex.LESSON_DECIMALS_TOLERANCE   # a number printed to six decimals
EXACT = 1e-10                         # float64 agreement between two computations of the same thing
TABLE = 1e-7                          # the model keeps its sinusoidal table in float32 (rounding 3e-8)


@dataclass(frozen=True)
class Claim:
    """One verified claim: its ID, a few words, what was measured, and whether it held."""

    id: str
    title: str
    measured: str
    passed: bool

    def to_dict(self) -> dict:
        return asdict(self)


CHECKS: dict[str, tuple[str, Callable[[], tuple[str, bool]]]] = {}


def check(claim_id: str, title: str):
    """Register a check: a function returning (measured, passed)."""
    def register(fn: Callable[[], tuple[str, bool]]) -> Callable[[], tuple[str, bool]]:
        CHECKS[claim_id] = (title, fn)
        return fn
    return register


def run_check(claim_id: str) -> Claim:
    """Run one check; an exception inside it is a failed check, reported in `measured`."""
    title, fn = CHECKS[claim_id]
    try:
        measured, passed = fn()
    except Exception as error:  # a broken model must show as FAIL, not crash the report
        measured, passed = f"error: {type(error).__name__}: {error}", False
    return Claim(claim_id, title, measured, bool(passed))


def run_all() -> list[Claim]:
    """Every claim, in the lesson's order."""
    return [run_check(claim_id) for claim_id in CHECKS]


# ---- shared material ---------------------------------------------------------------------

def _a(value) -> np.ndarray:
    return np.array(value, dtype=np.float64)


def _e(x: float) -> str:
    """A measured difference, short."""
    return "0" if x == 0 else f"{x:.1e}"


def seeded_model(seed: int = 0, **changes) -> Transformer:
    """A seeded, untrained tiny encoder–decoder over the lesson's vocabularies, float64, glass path."""
    cfg = ModelConfig.tiny(src_vocab=len(ex.SOURCE_VOCAB), tgt_vocab=len(ex.TARGET_VOCAB),
                           attention_path="glass", **changes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Transformer(cfg)
    return model.double().eval()


def _layer(seed: int = 0, **changes) -> EncoderLayer:
    cfg = ModelConfig.tiny(attention_path="glass", **changes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer = EncoderLayer(cfg)
    return layer.double().eval()


def _rows(seed: int, *shape: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape))


def source_ids(*sentences) -> torch.Tensor:
    return torch.tensor([ex.ids(s, ex.SOURCE_VOCAB) for s in sentences])


def target_ids(*sentences) -> torch.Tensor:
    return torch.tensor([ex.ids(s, ex.TARGET_VOCAB) for s in sentences])


def _block(**changes) -> dict:
    return run_spec({**ex.block_spec(), **changes})


def _np_softmax(s: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(s - s.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _diff(a, b) -> float:
    a = a.detach().numpy() if isinstance(a, torch.Tensor) else np.asarray(a, dtype=np.float64)
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b))) if a.shape == b.shape else math.inf


def _probes(trace, pattern: str) -> list[torch.Tensor]:
    import fnmatch
    return [t for name, t in trace.records.items() if fnmatch.fnmatchcase(name, pattern)]


# ---- A. attention arithmetic -------------------------------------------------------------

@check("A1", "rows stay rows: n×n scores and weights, n output rows")
def a1() -> tuple[str, bool]:
    model = seeded_model()
    shapes, ok = [], True
    for units in (ex.NINE_UNITS, ex.SIX_UNITS):
        with torch.no_grad(), model.probes(["encoder.0.self_attention.head.0.scores",
                                            "encoder.0.self_attention.head.0.weights", "encoder.output"]) as trace:
            model.encode(source_ids(units))
        n, d = len(units), model.cfg.d_model
        s = trace["encoder.0.self_attention.head.0.scores"][0]
        w = trace["encoder.0.self_attention.head.0.weights"][0]
        y = trace["encoder.output"][0]
        distinct = float(torch.cdist(y, y).add(torch.eye(n, dtype=y.dtype)).min())
        ok &= tuple(s.shape) == (n, n) and tuple(w.shape) == (n, n) and tuple(y.shape) == (n, d) and distinct > 1e-3
        shapes.append(f"{n} units: scores {s.shape[0]}×{s.shape[1]}, weights {w.shape[0]}×{w.shape[1]}, "
                      f"output {y.shape[0]}×{y.shape[1]}")
    return "; ".join(shapes), ok


@check("A2", "one W^Q, W^K, W^V shared by every position; Y = softmax(QKᵀ/√d_k)V")
def a2() -> tuple[str, bool]:
    r = _block()
    x = _a(ex.X)
    worst_proj, worst_y = 0.0, 0.0
    for h, (wq, wk, wv) in enumerate(((ex.W_Q1, ex.W_K1, ex.W_V1), (ex.W_Q2, ex.W_K2, ex.W_V2))):
        head = r["self_attention"]["heads"][h]
        q, k, v = _a(head["q"]), _a(head["k"]), _a(head["v"])
        worst_proj = max(worst_proj, _diff(q, x @ _a(wq)), _diff(k, x @ _a(wk)), _diff(v, x @ _a(wv)))
        worst_y = max(worst_y, _diff(head["output"], _np_softmax(q @ k.T / math.sqrt(q.shape[1])) @ v))
    return (f"max |Q−XW^Q|, |K−XW^K|, |V−XW^V| = {_e(worst_proj)}; |Y − softmax(QKᵀ/√d_k)V| = {_e(worst_y)}",
            worst_proj <= EXACT and worst_y <= EXACT)


@check("A3", "softmax along keys: rows sum to 1, columns need not")
def a3() -> tuple[str, bool]:
    tables = [_a(h["weights"]) for h in _block()["self_attention"]["heads"]]
    model = seeded_model()
    with torch.no_grad(), model.probes("encoder.*.self_attention.head.*.weights") as trace:
        model.encode(source_ids(ex.NINE_UNITS))
    tables += [t[0].numpy() for t in trace.records.values()]
    row_err = max(float(np.max(np.abs(w.sum(axis=1) - 1))) for w in tables)
    cols = np.concatenate([w.sum(axis=0) for w in tables])
    return (f"{len(tables)} tables: max |row sum − 1| = {_e(row_err)}; column sums {cols.min():.3f}…{cols.max():.3f}",
            row_err <= EXACT and float(np.max(np.abs(cols - 1))) > 0.05)


@check("A4", "scale before softmax: QKᵀ, then ÷√d_k, then softmax")
def a4() -> tuple[str, bool]:
    heads = _block()["self_attention"]["heads"]
    s, scaled, w = _a(heads[0]["scores"]), _a(heads[0]["scaled_scores"]), _a(heads[0]["weights"])
    order = max(_diff(scaled, s / math.sqrt(2)), _diff(w, _np_softmax(s / math.sqrt(2))))
    lesson = max(_diff(heads[0]["output"][0], ex.BLOCK_ROW1["head1"]),
                 _diff(heads[1]["output"][0], ex.BLOCK_ROW1["head2"]))
    return (f"scaled = QKᵀ/√2 and weights = softmax(scaled): |Δ| = {_e(order)}; "
            f"head outputs row 1 vs lesson |Δ| = {_e(lesson)}", order <= EXACT and lesson <= TOL)


@check("A5", "the 2×3 exercise, unscaled: QKᵀ, A, AV as printed")
def a5() -> tuple[str, bool]:
    r = run_spec(ex.exercise_spec(scale=False))
    errs = (_diff(r["scores"], ex.EXERCISE_SCORES), _diff(r["weights"], ex.EXERCISE_WEIGHTS),
            _diff(r["output"], ex.EXERCISE_OUTPUT))
    w, y = r["weights"], r["output"]
    return (f"A row 1 = ({w[0][0]:.6f}, {w[0][1]:.6f}, {w[0][2]:.6f}), AV row 1 = ({y[0][0]:.6f}, {y[0][1]:.6f}); "
            f"max |Δ| vs lesson {_e(max(errs))}", max(errs) <= TOL)


@check("A6", "the same exercise scaled (d_k = 2): 1 → 1/√2, weights change")
def a6() -> tuple[str, bool]:
    r = run_spec(ex.exercise_spec(scale=True))
    one, zero = r["scaled_scores"][0][0], r["scaled_scores"][0][1]
    moved = abs(r["weights"][0][0] - ex.EXERCISE_WEIGHTS[0][0])
    independent = max_difference(r, run_reference(ex.exercise_spec(scale=True)))
    return (f"score 1 → {one:.6f}, 0 → {zero:g}; weight[1][1] {ex.EXERCISE_WEIGHTS[0][0]} → {r['weights'][0][0]:.6f}; "
            f"vs reference |Δ| = {_e(independent)}",
            abs(one - ex.EXERCISE_SCALED_ONE) <= TOL and zero == 0 and moved > 1e-3 and independent <= EXACT)


@check("A7", "softmax attention is non-linear in X")
def a7() -> tuple[str, bool]:
    x = _a(ex.X)
    x2 = _a(np.random.default_rng(7).standard_normal(x.shape))
    mha = {name: _a(_block(x=v.tolist())["self_attention"]["output"])
           for name, v in (("x", x), ("2x", 2 * x), ("x2", x2), ("sum", x + x2))}
    q = {name: _a(_block(x=v.tolist())["self_attention"]["heads"][0]["q"]) for name, v in (("x", x), ("2x", 2 * x))}
    homogeneity = _diff(mha["2x"], 2 * mha["x"])
    additivity = _diff(mha["sum"], mha["x"] + mha["x2"])
    linear_q = _diff(q["2x"], 2 * q["x"])
    return (f"|MHA(2X) − 2MHA(X)| = {homogeneity:.3f}, |MHA(X+X') − MHA(X) − MHA(X')| = {additivity:.3f} "
            f"(projections alone: {_e(linear_q)})", homogeneity > 1e-2 and additivity > 1e-2 and linear_q <= EXACT)


# ---- B. multi-head attention and the block -----------------------------------------------

@check("B1", "each head has its own W_r^Q, W_r^K, W_r^V and its own table")
def b1() -> tuple[str, bool]:
    heads = _block()["self_attention"]["heads"]
    apart = _diff(heads[0]["weights"], heads[1]["weights"])
    lesson = max(_diff(heads[0]["output"][0], ex.BLOCK_ROW1["head1"]),
                 _diff(heads[1]["output"][0], ex.BLOCK_ROW1["head2"]))
    o1, o2 = heads[0]["output"][0], heads[1]["output"][0]
    return (f"head tables differ by up to {apart:.3f}; row 1: head 1 ({o1[0]:.6f}, {o1[1]:.6f}), "
            f"head 2 ({o2[0]:.6f}, {o2[1]:.6f}), |Δ| vs lesson {_e(lesson)}", apart > 0.05 and lesson <= TOL)


@check("B2", "Concat(H_1..H_H) is n×(H·d_v); W^O brings it back to n×d")
def b2() -> tuple[str, bool]:
    sa = _block()["self_attention"]
    concat, out = _a(sa["concat"]), _a(sa["output"])
    parts = np.concatenate([_a(h["output"]) for h in sa["heads"]], axis=1)
    err = max(_diff(concat, parts), _diff(out, concat @ _a(ex.W_O)))
    lesson = _diff(out[0], ex.BLOCK_ROW1["mha"])
    return (f"concat {concat.shape[0]}×{concat.shape[1]}, MHA {out.shape[0]}×{out.shape[1]}; "
            f"|MHA − concat·W^O| = {_e(err)}; row 1 ({', '.join(f'{v:.6f}' for v in out[0])}) |Δ| {_e(lesson)}",
            concat.shape == (3, 4) and out.shape == _a(ex.X).shape and err <= EXACT and lesson <= TOL)


@check("B3", "the BLOCK's numbers: every printed stage of row 1, all three rows computed")
def b3() -> tuple[str, bool]:
    r = _block()
    got = {"head1": r["self_attention"]["heads"][0]["output"][0], "head2": r["self_attention"]["heads"][1]["output"][0],
           "mha": r["self_attention"]["output"][0], "x_plus_mha": r["sublayers"][0]["residual"][0],
           "ln1": r["sublayers"][0]["normed"][0], "ffn_hidden": r["ffn"]["hidden"][0],
           "ffn": r["ffn"]["output"][0], "ln2": r["output"][0]}
    lesson = max(_diff(got[k], v) for k, v in ex.BLOCK_ROW1.items())
    rows = max_difference(r, run_reference(ex.block_spec()))
    z = r["output"][0]
    return (f"Z row 1 = ({', '.join(f'{v:.6f}' for v in z)}); 8 stages vs lesson max |Δ| = {_e(lesson)}; "
            f"3 rows vs reference {_e(rows)}", lesson <= TOL and rows <= EXACT and len(r["output"]) == 3)


@check("B4", "post-norm: U = LN₁(X + MHA(X)), Z = LN₂(U + FFN(U)); pre-norm the alternative")
def b4() -> tuple[str, bool]:
    ones, zeros = np.ones(4), np.zeros(4)
    post, pre = _block(norm="post"), _block(norm="pre")
    x = _a(ex.X)
    u = layer_norm(x + _a(post["self_attention"]["output"]), ones, zeros, ex.EPS)
    z = layer_norm(u + _a(post["ffn"]["output"]), ones, zeros, ex.EPS)
    err_post = max(_diff(post["sublayers"][0]["normed"], u), _diff(post["sublayers"][1]["input"], u),
                   _diff(post["output"], z))
    x_ln = layer_norm(x, ones, zeros, ex.EPS)
    err_pre = max(_diff(pre["sublayers"][0]["normed"], x_ln),
                  _diff(pre["sublayers"][0]["residual"], x + _a(pre["self_attention"]["output"])),
                  _diff(pre["output"], pre["sublayers"][1]["residual"]))
    finals = {norm: Transformer(ModelConfig.tiny(norm=norm, src_vocab=4, tgt_vocab=4)).encoder.norm is not None
              for norm in ("post", "pre")}
    # dropout acts on Sub(x) before the residual add: x itself is never dropped
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        rn = ResidualNorm(8, 1e-5, "post", dropout=0.5).double().train()
        xin, c = _rows(1, 1, 6, 8), torch.full((1, 6, 8), 3.0, dtype=torch.float64)
        with probes(rn, "residual") as trace:
            rn(xin, lambda h: c)
    added = (trace["residual"] - xin).numpy()
    dropout_ok = bool(np.all(np.isclose(added, 0.0) | np.isclose(added, 6.0))) and bool(np.any(np.isclose(added, 0)))
    return (f"post |Δ| = {_e(err_post)}, pre |Δ| = {_e(err_pre)}; stack final LN: post {finals['post']}, "
            f"pre {finals['pre']}; dropout on Sub(x) only: {dropout_ok}",
            err_post <= EXACT and err_pre <= EXACT and finals == {"post": False, "pre": True} and dropout_ok)


@check("B5", "LayerNorm per token: other rows and other sentences change nothing")
def b5() -> tuple[str, bool]:
    layer = _layer(3)
    norm = layer.sublayer[0].norm
    with torch.no_grad():
        norm.weight.copy_(_rows(4, 32))
        norm.bias.copy_(_rows(5, 32))
        x = _rows(6, 2, 5, 32)                                               # (batch, len, d)
        y = norm(x)
        formula = layer_norm(x[0].numpy(), norm.weight.numpy(), norm.bias.numpy(), norm.eps)
        x_other = x.clone()
        x_other[0, 1:] += _rows(7, 4, 32) * 3
        x_other[1] = _rows(8, 5, 32)
        row_moved = _diff(norm(x_other)[0, 0], y[0, 0])
        whole = layer(x)
        x_batch = x.clone()
        x_batch[1] = _rows(9, 5, 32) * 2
        sentence_moved = _diff(layer(x_batch)[0], whole[0])
    err = _diff(y[0], formula)
    return (f"LN vs γ⊙(x−μ)/√(σ²+ε)+β per row |Δ| = {_e(err)}; other rows changed: row 1 moves {_e(row_moved)}; "
            f"other sentence changed: encoder layer output moves {_e(sentence_moved)}",
            err <= EXACT and row_moved <= EXACT and sentence_moved <= EXACT)


@check("B6", "FFN = ReLU(xW₁+b₁)W₂+b₂, same weights at every row, each row alone")
def b6() -> tuple[str, bool]:
    ffn = _layer(4).ffn
    with torch.no_grad():
        x = _rows(10, 1, 6, 32)
        x[0, 4] = x[0, 1]                                                    # the same row at two positions
        y = ffn(x)
        w1, b1 = ffn.w_1.weight.numpy().T, ffn.w_1.bias.numpy()
        w2, b2 = ffn.w_2.weight.numpy().T, ffn.w_2.bias.numpy()
        formula = np.maximum(x[0].numpy() @ w1 + b1, 0) @ w2 + b2
        x_other = x.clone()
        x_other[0, 2:] = _rows(11, 4, 32)
        moved = _diff(ffn(x_other)[0, :2], y[0, :2])
    err, same = _diff(y[0], formula), _diff(y[0, 4], y[0, 1])
    return (f"|FFN − formula| = {_e(err)}; equal rows → equal outputs {_e(same)}; other rows changed: {_e(moved)}",
            err <= EXACT and same <= EXACT and moved == 0)


@check("B7", "d(x+F(x))/dx = I + J_F; the block's gradient is not identically 1")
def b7() -> tuple[str, bool]:
    layer = _layer(5)
    sub, ffn = layer.sublayer[1], layer.ffn
    u = _rows(12, 1, 1, 32)
    jac = torch.autograd.functional.jacobian
    j_f = jac(lambda t: ffn(t), u).reshape(32, 32)
    j_res = jac(lambda t: t + ffn(t), u).reshape(32, 32)
    j_block = jac(lambda t: sub(t, ffn), u).reshape(32, 32)                   # post-norm: LN(u + FFN(u))
    eye = torch.eye(32, dtype=torch.float64)
    direct = _diff(j_res, eye + j_f)
    off_identity = _diff(j_res, eye)
    ln_effect = _diff(j_block, eye + j_f)
    return (f"|J(x+F) − (I+J_F)| = {_e(direct)}; |J(x+F) − I| = {off_identity:.3f}; "
            f"with the LN after it |J − (I+J_F)| = {ln_effect:.3f}",
            direct <= EXACT and off_identity > 1e-2 and ln_effect > 1e-2)


@check("B8", "a switched-off head removes exactly its contribution before W^O")
def b8() -> tuple[str, bool]:
    full = _block()["self_attention"]
    worst, moved = 0.0, math.inf
    for off in (0, 1):
        keep = 1 - off
        sa = _block(disabled_heads=[off])["self_attention"]
        concat = _a(sa["concat"])
        w_o_keep = _a(ex.W_O)[2 * keep: 2 * keep + 2]
        worst = max(worst, _diff(sa["heads"][keep]["output"], full["heads"][keep]["output"]),
                    float(np.max(np.abs(concat[:, 2 * off: 2 * off + 2]))),
                    _diff(sa["output"], _a(full["heads"][keep]["output"]) @ w_o_keep))
        moved = min(moved, _diff(sa["output"], full["output"]))
    return (f"other head unchanged, its columns zero, MHA = H_kept·W^O rows: max |Δ| = {_e(worst)}; "
            f"output moves by ≥ {moved:.3f}", worst <= EXACT and moved > 1e-2)


# ---- C. order and positions ----------------------------------------------------------------

_PERM = [4, 0, 7, 2, 8, 1, 6, 3, 5]


@check("C1", "no positions, full attention: permuting rows permutes outputs (Y' = PY)")
def c1() -> tuple[str, bool]:
    model = seeded_model(1, positions="none")
    units = ex.NINE_UNITS
    out, scores = [], []
    for seq in (units, [units[i] for i in _PERM]):
        with torch.no_grad(), model.probes("encoder.0.self_attention.head.0.scores") as trace:
            out.append(model.encode(source_ids(seq))[0])
        scores.append(trace["encoder.0.self_attention.head.0.scores"][0])
    p = torch.tensor(_PERM)
    equi = _diff(out[1], out[0][p])
    s_err = _diff(scores[1], scores[0][p][:, p])
    invariant = _diff(out[1], out[0])
    pooled = _diff(out[1].mean(0), out[0].mean(0))
    return (f"|Y' − PY| = {_e(equi)}, |S' − PSPᵀ| = {_e(s_err)}; not invariant: |Y' − Y| = {invariant:.2f}; "
            f"mean-pooled |Δ| = {_e(pooled)}",
            equi <= EXACT and s_err <= EXACT and invariant > 1e-2 and pooled <= EXACT)


@check("C2", "positions break it: 我给他 ≠ 他给我 beyond a permutation")
def c2() -> tuple[str, bool]:
    a, b = ("我", "给", "他"), ("他", "给", "我")
    p = torch.tensor([2, 1, 0])
    gaps = {}
    for positions in ("sinusoidal", "none"):
        model = seeded_model(2, positions=positions)
        with torch.no_grad():
            ya, yb = model.encode(source_ids(a))[0], model.encode(source_ids(b))[0]
        gaps[positions] = _diff(yb, ya[p])
    model = seeded_model(2)
    with torch.no_grad(), model.probes("encoder.embedding") as trace:
        model.encode(source_ids(a))
    d = model.cfg.d_model
    token = model.src_embed.token.weight[source_ids(a)[0]].detach().numpy()
    pe = np.array([[math.sin(p_ / 10000 ** (2 * (i // 2) / d)) if i % 2 == 0 else
                    math.cos(p_ / 10000 ** (2 * (i // 2) / d)) for i in range(d)] for p_ in range(3)])
    emb = _diff(trace["encoder.embedding"][0], token * math.sqrt(d) + pe)
    return (f"|Y(他给我) − P·Y(我给他)| = {gaps['sinusoidal']:.3f} with positions, {_e(gaps['none'])} without; "
            f"X_i = E[x_i]√d + p_i |Δ| = {_e(emb)}", gaps["sinusoidal"] > 1e-2 and gaps["none"] <= EXACT
            and emb <= TABLE)


@check("C3", "a causal mask changes visibility: the equivariance argument fails")
def c3() -> tuple[str, bool]:
    layer = _layer(6, positions="none")
    x = _rows(13, 1, 6, 32)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    gaps = {}
    with torch.no_grad():
        for causal in (False, True):
            gaps[causal] = _diff(layer(x[:, perm], causal=causal)[0], layer(x, causal=causal)[0][perm])
    return (f"|Y' − PY| full attention {_e(gaps[False])}, causal {gaps[True]:.3f}",
            gaps[False] <= EXACT and gaps[True] > 1e-2)


@check("C4", "PE(p,2r) = sin(p/10000^(2r/d)), PE(p,2r+1) = cos; tokens × √d; learned table the alternative")
def c4() -> tuple[str, bool]:
    n, d = 50, 32
    table = sinusoidal_positions(n, d, torch.float64).numpy()
    formula = np.zeros((n, d))
    for p in range(n):
        for r in range(d // 2):
            formula[p, 2 * r] = math.sin(p / 10000 ** (2 * r / d))
            formula[p, 2 * r + 1] = math.cos(p / 10000 ** (2 * r / d))
    err = _diff(table, formula)
    model = seeded_model(3)
    ids = source_ids(ex.NINE_UNITS)
    with torch.no_grad():
        emb = model.src_embed(ids)[0].numpy()
    tok = model.src_embed.token.weight[ids[0]].detach().numpy() * math.sqrt(model.cfg.d_model)
    scaled = _diff(emb, tok + formula[:9])
    learned = seeded_model(3, positions="learned").src_embed.learned
    learned_ok = learned is not None and learned.table.weight.requires_grad and \
        tuple(learned.table.weight.shape) == (model.cfg.max_len, d)
    return (f"table vs formula |Δ| = {_e(err)}; embedding = E·√d + PE |Δ| = {_e(scaled)}; "
            f"learned table {'trainable' if learned_ok else 'missing'}",
            err <= 1e-12 and scaled <= TABLE and learned_ok)


@check("C5", "relative bias b_{i−j}: depends on the offset only")
def c5() -> tuple[str, bool]:
    layer = _layer(7, positions="relative", relative_clip=3)
    mha = layer.self_attention
    with torch.no_grad(), probes(mha, "head.*.scores", "head.*.scaled_scores") as trace:
        mha(_rows(14, 1, 7, 32))
    toeplitz, spread, table = 0.0, math.inf, 0.0
    for h in range(mha.heads):
        bias = (trace[f"head.{h}.scaled_scores"] - trace[f"head.{h}.scores"] / math.sqrt(mha.d_k))[0].numpy()
        toeplitz = max(toeplitz, float(np.max(np.abs(bias[1:, 1:] - bias[:-1, :-1]))))
        spread = min(spread, float(bias.max() - bias.min()))
        want = np.array([[mha.relative.bias[h, max(-3, min(3, i - j)) + 3].item() for j in range(7)]
                         for i in range(7)])
        table = max(table, _diff(bias, want))
    return (f"S − QKᵀ/√d_k: |b[i+1,j+1] − b[i,j]| = {_e(toeplitz)}; equals b_(i−j) |Δ| = {_e(table)}; "
            f"offsets differ by ≥ {spread:.3f}", toeplitz <= EXACT and table <= EXACT and spread > 1e-4)


@check("C6", "RoPE: q̃_i·k̃_j depends on j − i only; rotates Q/K in every layer")
def c6() -> tuple[str, bool]:
    d_k = 8
    rope = RotaryEmbedding(d_k).double()
    rng = np.random.default_rng(15)
    q, k = rng.standard_normal(d_k), rng.standard_normal(d_k)
    theta = 10000.0 ** (-np.arange(0, d_k, 2) / d_k)

    def rotated(v: np.ndarray, pos: int) -> np.ndarray:
        t = torch.from_numpy(v)[None, None, None, :]
        return rope(t, torch.tensor([pos]))[0, 0, 0].numpy()

    def r_offset(v: np.ndarray, phi: np.ndarray) -> np.ndarray:      # R(phi) on each pair (2r, 2r+1)
        out = v.copy()
        out[0::2] = np.cos(phi) * v[0::2] - np.sin(phi) * v[1::2]
        out[1::2] = np.sin(phi) * v[0::2] + np.cos(phi) * v[1::2]
        return out

    worst_shift, worst_formula = 0.0, 0.0
    for i, j in ((0, 3), (2, 5), (4, 1), (6, 6), (1, 9)):
        dot = rotated(q, i) @ rotated(k, j)
        worst_shift = max(worst_shift, abs(dot - rotated(q, i + 5) @ rotated(k, j + 5)))
        worst_formula = max(worst_formula, abs(dot - q @ r_offset(k, (j - i) * theta)))
    # inside the model: no position vector in the embedding, and Q rotated in every layer
    model = seeded_model(4, positions="rope")
    ids = source_ids(ex.NINE_UNITS)
    with torch.no_grad(), model.probes("encoder.*.self_attention.head.0.q", "encoder.*.sublayer.0.input") as trace:
        emb = model.src_embed(ids)
        model.encode(ids)
    plain_embedding = _diff(emb, model.src_embed.token.weight[ids] * math.sqrt(model.cfg.d_model))
    rotated_layers = 0
    for i, layer in enumerate(model.encoder.layers):
        with torch.no_grad():
            unrotated = layer.self_attention.project(trace[f"encoder.{i}.sublayer.0.input"])[0][:, 0]
        got = trace[f"encoder.{i}.self_attention.head.0.q"]
        norms = _diff(got.reshape(1, 9, -1, 2).norm(dim=-1), unrotated.reshape(1, 9, -1, 2).norm(dim=-1))
        if _diff(got[:, 0], unrotated[:, 0]) <= EXACT and _diff(got, unrotated) > 1e-3 and norms <= EXACT:
            rotated_layers += 1
    n_layers = len(model.encoder.layers)
    return (f"shift (i,j)→(i+5,j+5) |Δ dot| = {_e(worst_shift)}; = qᵀR((j−i)θ)k |Δ| = {_e(worst_formula)}; "
            f"{len(theta)} frequencies; Q rotated in {rotated_layers}/{n_layers} layers; "
            f"embedding has no position vector |Δ| = {_e(plain_embedding)}",
            worst_shift <= EXACT and worst_formula <= EXACT and rotated_layers == n_layers
            and plain_embedding <= EXACT and len(set(theta.tolist())) > 1)


# ---- D. the whole translator ---------------------------------------------------------------

@check("D1", "two stacks: encoder 2 sub-layers, decoder 3 with cross-attention that is used")
def d1() -> tuple[str, bool]:
    model = seeded_model(5)
    enc = [len(layer.sublayer) for layer in model.encoder.layers]
    dec = [len(layer.sublayer) for layer in model.decoder.layers]
    cross = all(isinstance(layer.cross_attention, MultiHeadAttention) for layer in model.decoder.layers)
    no_cross_enc = all(not hasattr(layer, "cross_attention") for layer in model.encoder.layers)
    norms = [id(s.norm) for stack in (model.encoder.layers, model.decoder.layers) for layer in stack
             for s in layer.sublayer]
    tgt = target_ids(ex.TARGET_INPUT)
    with torch.no_grad():
        a = model(source_ids(ex.NINE_UNITS), tgt)
        b = model(source_ids(["他" if u == "我" else "我" if u == "他" else u for u in ex.NINE_UNITS]), tgt)
    used = _diff(a, b)
    bare = DecoderLayer(model.cfg, cross=False)
    return (f"encoder sub-layers {enc}, decoder {dec}; cross-attention in every decoder layer: {cross}; "
            f"{len(set(norms))} separate norms; changing the source moves the logits by {used:.3f}",
            enc == [2] * len(enc) and dec == [3] * len(dec) and cross and no_cross_enc
            and len(set(norms)) == len(norms) and used > 1e-3 and len(bare.sublayer) == 2
            and bare.cross_attention is None)


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return source_ids(*ex.BATCH_SOURCE), target_ids(*ex.BATCH_TARGET_INPUT), target_ids(*ex.BATCH_LABELS)


@check("D2", "cross-attention: Q from the decoder, K/V from the final H; every valid source, no PAD")
def d2() -> tuple[str, bool]:
    model = seeded_model(6)
    src, tgt, _ = _batch()
    src_pad = src == 0
    with torch.no_grad(), model.probes(["decoder.*.cross_attention.head.*.weights",
                                        "decoder.*.cross_attention.head.*.k", "decoder.*.cross_attention.head.*.q",
                                        "decoder.*.sublayer.1.input", "encoder.output"]) as trace:
        model(src, tgt)
    valid_min, pad_max = math.inf, 0.0
    for w in _probes(trace, "decoder.*.cross_attention.head.*.weights"):   # (batch, tgt, src)
        valid_min = min(valid_min, float(w.masked_select(~src_pad[:, None, :]).min()))
        pad_max = max(pad_max, float(w.masked_select(src_pad[:, None, :]).abs().max()))
    memory = trace["encoder.output"]
    kv_err = 0.0
    for i, layer in enumerate(model.decoder.layers):
        mha = layer.cross_attention
        with torch.no_grad():
            k_want = mha.project_kv(memory)[0]
            q_want = mha.project_q(trace[f"decoder.{i}.sublayer.1.input"])
        for h in range(mha.heads):
            kv_err = max(kv_err, _diff(trace[f"decoder.{i}.cross_attention.head.{h}.k"], k_want[:, h]),
                         _diff(trace[f"decoder.{i}.cross_attention.head.{h}.q"], q_want[:, h]))
    return (f"min weight on a valid source key {valid_min:.4f} (every target row, no triangle); "
            f"max on source PAD {_e(pad_max)}; K from H, Q from the decoder |Δ| = {_e(kv_err)}",
            valid_min > 0 and pad_max == 0 and kv_err <= EXACT)


@check("D3", "right shift: the `gave` row sees BOS, I, gave only")
def d3() -> tuple[str, bool]:
    model = seeded_model(7)
    src, tgt = source_ids(ex.NINE_UNITS), target_ids(ex.TARGET_INPUT)
    shifted = list(ex.TARGET_INPUT) == [ex.BOS, *ex.TARGET_LABELS[:-1]] and ex.TARGET_LABELS[ex.GAVE_ROW] == "him"
    g = ex.GAVE_ROW
    with torch.no_grad(), model.probes("decoder.*.self_attention.head.*.weights") as trace:
        base = model(src, tgt)[0, g]
    seen = set()
    for w in trace.records.values():
        seen |= set(torch.nonzero(w[0, g] > 0).flatten().tolist())
    other = ex.TARGET_VOCAB["book"]
    future, past = 0.0, math.inf
    for pos in range(len(ex.TARGET_INPUT)):
        t2 = tgt.clone()
        t2[0, pos] = other if int(t2[0, pos]) != other else ex.TARGET_VOCAB["a"]
        with torch.no_grad():
            moved = _diff(model(src, t2)[0, g], base)
        if pos > g:
            future = max(future, moved)
        else:
            past = min(past, moved)
    return (f"keys seen by the gave row: {sorted(seen)}; changing him… moves its logits {_e(future)}, "
            f"changing BOS/I/gave ≥ {past:.3f}", shifted and seen == set(range(g + 1)) and future == 0 and past > 1e-4)


@check("D4", "three scopes: source sees source, target sees its prefix, target sees the whole source")
def d4() -> tuple[str, bool]:
    model = seeded_model(8)
    src, tgt = source_ids(ex.NINE_UNITS), target_ids(ex.TARGET_INPUT)
    with torch.no_grad(), model.probes("*coder.*.*_attention.head.*.weights") as trace:
        model(src, tgt)
    n, m = src.size(1), tgt.size(1)
    want = {"encoder.*.self_attention": np.ones((n, n), bool),
            "decoder.*.self_attention": np.tril(np.ones((m, m), bool)),
            "decoder.*.cross_attention": np.ones((m, n), bool)}
    ok, counts = True, []
    for scope, table in want.items():
        tables = _probes(trace, f"{scope}.head.*.weights")
        ok &= bool(tables) and all(np.array_equal(w[0].numpy() > 0, table) for w in tables)
        counts.append(f"{scope.replace('.*.', ' ')} {int(table.sum())}/{table.size}")
    return "visible pairs: " + ", ".join(counts) + f" (all {len(trace.records)} head tables agree)", ok


def greedy(model: Transformer, src: torch.Tensor, bos: int, eos: int, max_steps: int) -> tuple[list[int], list]:
    """Greedy generation with the KV cache: feed back the argmax, stop after EOS. Returns tokens and logits."""
    src_pad = src == model.cfg.pad_id
    memory = model.encode(src, src_pad)
    cache = model.new_cache()
    token, tokens, steps = bos, [], []
    for _ in range(max_steps):
        logits = model.decode_step(torch.tensor([[token]]), memory, src_pad, cache)[0, -1]   # (vocab,)
        steps.append(logits)
        token = int(logits.argmax())
        tokens.append(token)
        if token == eos:
            break
    return tokens, steps


@check("D5", "vocabulary head → softmax; the chosen token is fed back; generation stops at EOS")
def d5() -> tuple[str, bool]:
    # An untrained model whose (untied) head reads out `I gave him a book yesterday . EOS`: row t of the
    # head is the unit vector of the decoder state after the right-shifted prefix of length t + 1. The
    # states depend only on the fed-back tokens, so greedy decoding walks the sentence only if every
    # step feeds back its choice, and it must stop at EOS before the 12 steps allowed.
    model = seeded_model(9, tie_target=False)
    v = ex.TARGET_VOCAB
    chain = [v[t] for t in ex.TARGET_LABELS]
    src = source_ids(ex.NINE_UNITS)
    with torch.no_grad():
        memory = model.encode(src)
        hidden = model.decode(target_ids(ex.TARGET_INPUT), memory, src == 0)[0]     # (tgt, d)
        wired = torch.zeros_like(model.generator.weight)                             # (vocab, d)
        for t, token in enumerate(chain):
            wired[token] = hidden[t] / hidden[t].norm()
        model.generator.weight.copy_(wired)
        tokens, logits = greedy(model, src, v[ex.BOS], v[ex.EOS], max_steps=12)
        probs = torch.softmax(logits[0], dim=-1)
        forced = model(src, torch.tensor([[v[ex.BOS], *tokens[:-1]]]))[0]   # teacher forcing on the output
    fed_back = _diff(torch.stack(logits), forced) if len(logits) == len(forced) else math.inf
    width = logits[0].shape[0]
    words = " ".join(next(w for w, i in v.items() if i == t) for t in tokens)
    return (f"logits over {width} target tokens, softmax sums to {float(probs.sum()):.12f}; greedy: {words} "
            f"({len(tokens)} steps of 12 allowed); steps = teacher-forced on the fed-back tokens |Δ| = {_e(fed_back)}",
            width == model.cfg.tgt_vocab and abs(float(probs.sum()) - 1) <= EXACT and fed_back <= 1e-8
            and tokens == chain)


@check("D6", "teacher-forced logits = step-by-step recomputed = KV-cached (fp32)")
def d6() -> tuple[str, bool]:
    cfg = ModelConfig.tiny(src_vocab=len(ex.SOURCE_VOCAB), tgt_vocab=len(ex.TARGET_VOCAB))   # fp32, fast path
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(10)
        model = Transformer(cfg).eval()
    src, tgt = source_ids(ex.NINE_UNITS), target_ids(ex.TARGET_INPUT)
    m = tgt.size(1)
    with torch.no_grad():
        forced = model(src, tgt)[0]                                          # (tgt, vocab)
        recomputed = torch.stack([model(src, tgt[:, : t + 1])[0, -1] for t in range(m)])
        src_pad = src == 0
        memory = model.encode(src, src_pad)
        cache = model.new_cache()
        cached, cross_k = [], None
        for t in range(m):
            cached.append(model.decode_step(tgt[:, t: t + 1], memory, src_pad, cache)[0, -1])
            if t == 0:
                cross_k = cache.layers[0].cross.k
        cached = torch.stack(cached)
    once = cache.layers[0].cross.k is cross_k and cache.length == m
    a, b = _diff(forced, recomputed), _diff(forced, cached)
    return (f"{m} positions: |teacher − recomputed| = {_e(a)}, |teacher − cached| = {_e(b)}; "
            f"self cache {cache.length} rows, cross K/V computed once: {once}", a <= 1e-5 and b <= 1e-5 and once)


@check("D7", "base: 6+6 layers, d 512, 8 heads, d_k = d_v = 64, d_ff 2048")
def d7() -> tuple[str, bool]:
    cfg = ModelConfig.base()
    with torch.device("meta"):
        model = Transformer(cfg)
    mha = model.encoder.layers[0].self_attention
    shapes = {"in_proj": tuple(mha.in_proj.weight.shape), "out_proj": tuple(mha.out_proj.weight.shape),
              "w_1": tuple(model.encoder.layers[0].ffn.w_1.weight.shape),
              "w_2": tuple(model.decoder.layers[0].ffn.w_2.weight.shape)}
    n_enc, n_dec = len(model.encoder.layers), len(model.decoder.layers)
    ok = (n_enc, n_dec) == (6, 6) and (mha.heads, mha.d_k, mha.d_v, mha.d_model) == (8, 64, 64, 512) and shapes == {
        "in_proj": (8 * (64 + 64 + 64), 512), "out_proj": (512, 8 * 64), "w_1": (2048, 512), "w_2": (512, 2048)}
    ok &= all((layer.cross_attention.q_proj.out_features + layer.cross_attention.kv_proj.out_features,
               layer.cross_attention.kv_proj.in_features) == (1536, 512) for layer in model.decoder.layers)
    return (f"{n_enc}+{n_dec} layers, d {mha.d_model}, {mha.heads} heads, d_k {mha.d_k}, d_v {mha.d_v}; "
            f"in_proj {shapes['in_proj'][0]}×{shapes['in_proj'][1]}, W^O {shapes['out_proj'][0]}×"
            f"{shapes['out_proj'][1]}, W_1 {shapes['w_1'][1]}→{shapes['w_1'][0]}", ok)


# ---- E. batches and masks -----------------------------------------------------------------

@check("E1", "source padding: B's positions 2–5 are never valid keys (encoder, cross-attention)")
def e1() -> tuple[str, bool]:
    model = seeded_model(11)
    src, tgt, _ = _batch()
    pad = (src == 0)[1]
    with torch.no_grad(), model.probes("encoder.*.self_attention.head.*.weights",
                                       "decoder.*.cross_attention.head.*.weights") as trace:
        model(src, tgt)
    pad_max, valid_min = 0.0, math.inf
    for w in trace.records.values():
        pad_max = max(pad_max, float(w[1][:, pad].abs().max()))
        valid_min = min(valid_min, float(w[1][:, ~pad].min()))
    return (f"B's PAD positions {torch.nonzero(pad).flatten().tolist()}: max weight {_e(pad_max)} over "
            f"{len(trace.records)} tables; valid keys ≥ {valid_min:.4f}",
            pad.tolist() == [False, False, True, True, True, True] and pad_max == 0 and valid_min > 0)


@check("E2", "target masks: the 6×6 causal table combined with each sample's key padding")
def e2() -> tuple[str, bool]:
    model = seeded_model(12)
    src, tgt, _ = _batch()
    tgt_pad = tgt == 0
    tri = causal_mask(6)
    combined = combine(tri, padding_mask(tgt_pad))[:, 0]                      # (batch, query, key)
    want = np.tril(np.ones((6, 6), bool))[None] & ~tgt_pad.numpy()[:, None, :]
    with torch.no_grad(), model.probes("decoder.*.self_attention.head.*.weights") as trace:
        model(src, tgt, tgt_pad=tgt_pad)
    traced = all(np.array_equal(w.numpy() > 0, want) for w in trace.records.values())
    counts = [int(c.sum()) for c in combined]
    return (f"causal {int(tri.sum())}/36 visible; combined A {counts[0]}, B {counts[1]}; "
            f"{len(trace.records)} traced decoder tables match",
            np.array_equal(tri.numpy(), np.tril(np.ones((6, 6), bool))) and np.array_equal(combined.numpy(), want)
            and traced and counts == [21, 18])


@check("E3", "loss mask: exactly three loss terms count for B")
def e3() -> tuple[str, bool]:
    model = seeded_model(13)
    src, tgt, labels = _batch()
    with torch.no_grad():
        total, n = model.loss(src, tgt, labels)
        loss_b, n_b = model.loss(src[1:], tgt[1:], labels[1:])
        logits = model(src[1:], tgt[1:])[0].numpy()
    lab = labels[1].numpy()
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    want = -sum(logp[i, lab[i]] for i in range(len(lab)) if lab[i] != 0)
    err = abs(float(loss_b) - want)
    mask_b = int(loss_mask(labels[1]).sum())
    return (f"terms: B {n_b}, batch {n}; loss_mask(B) {mask_b}; B's loss = Σ of its 3 terms |Δ| = {_e(err)}",
            n_b == 3 and n == 9 and mask_b == 3 and err <= 1e-4 * max(1.0, abs(want)))


@check("E4", "padding changes nothing real: valid outputs and loss are unchanged")
def e4() -> tuple[str, bool]:
    model = seeded_model(14)
    src, tgt, labels = _batch()
    alone_src, alone_tgt, alone_lab = src[1:, :2], tgt[1:, :3], labels[1:, :3]
    with torch.no_grad():
        padded = model(src, tgt)[1, :3]
        alone = model(alone_src, alone_tgt)[0]
        loss_alone, _ = model.loss(alone_src, alone_tgt, alone_lab)
        loss_padded, _ = model.loss(src[1:], tgt[1:], labels[1:])
        wider = (torch.nn.functional.pad(src, (0, 3)), torch.nn.functional.pad(tgt, (0, 2)))
        a_wide, a = model(*wider)[0, :6], model(src, tgt)[0]
    out, more = _diff(padded, alone), _diff(a_wide, a)
    loss = abs(float(loss_alone) - float(loss_padded))
    return (f"B in the batch vs alone: logits |Δ| = {_e(out)}, loss |Δ| = {_e(loss)}; "
            f"A with 3 more source and 2 more target PAD |Δ| = {_e(more)}",
            out <= EXACT and more <= EXACT and loss <= 1e-5)


# ---- F. families ------------------------------------------------------------------------

@check("F1", "encoder-only, decoder-only, encoder–decoder from the same layers")
def f1() -> tuple[str, bool]:
    cfg = ModelConfig.tiny(src_vocab=12, tgt_vocab=12, attention_path="glass")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(16)
        models = {fam: build_model(cfg.replace(family=fam)).double().eval()
                  for fam in ("encoder-only", "decoder-only", "encoder-decoder")}
    enc, dec, ed = models["encoder-only"], models["decoder-only"], models["encoder-decoder"]
    same_parts = (isinstance(enc, EncoderOnlyModel) and isinstance(dec, DecoderOnlyModel)
                  and isinstance(ed, Transformer)
                  and all(type(layer) is EncoderLayer for layer in [*enc.encoder.layers, *ed.encoder.layers])
                  and all(type(layer) is DecoderLayer for layer in [*dec.decoder.layers, *ed.decoder.layers])
                  and all(layer.cross_attention is None for layer in dec.decoder.layers)
                  and all(layer.cross_attention is not None for layer in ed.decoder.layers))
    ids = torch.tensor([[3, 5, 7, 4, 6]])
    last = ids.clone()
    last[0, -1] = 9
    with torch.no_grad():
        bidirectional = _diff(enc(ids)[0, 0], enc(last)[0, 0])
        causal = _diff(dec(ids)[0, :-1], dec(last)[0, :-1])
        cross = _diff(ed(ids, ids)[0], ed(last, ids)[0])
    heads = (enc(ids).shape[-1], dec(ids).shape[-1])
    return (f"same EncoderLayer/DecoderLayer classes: {same_parts}; changing the last token moves position 0: "
            f"encoder-only {bidirectional:.3f}, decoder-only {_e(causal)}; source change moves encoder–decoder "
            f"logits {cross:.3f}",
            same_parts and bidirectional > 1e-4 and causal == 0 and cross > 1e-4 and heads == (12, 12))


# ---- G. diagnosis -------------------------------------------------------------------------

@check("G1", "the BLOCK traced, a head switched off, the norm moved: each pass re-checked")
def g1() -> tuple[str, bool]:
    variants = {"post": {}, "pre": {"norm": "pre"}, "head 1 off": {"disabled_heads": [0]},
                "head 2 off": {"disabled_heads": [1]}, "pre + head 2 off": {"norm": "pre", "disabled_heads": [1]}}
    base = _block()
    worst, moved = 0.0, math.inf
    for changes in variants.values():
        doc = {**ex.block_spec(), **changes}
        r = run_spec(doc)
        worst = max(worst, max_difference(r, run_reference(doc)))
        if changes:
            moved = min(moved, _diff(r["output"][0], base["output"][0]))
    stages = len(base["sublayers"]) * 3 + len(base["self_attention"]["heads"]) * 7 + 5
    return (f"{len(variants)} forward passes vs the float64 reference: max |Δ| = {_e(worst)}; "
            f"each change moves Z row 1 by ≥ {moved:.3f}; {stages} intermediates per pass",
            worst <= EXACT and moved > 1e-3)


@check("G2", "她 → 他 diagnosis: source info reaches the target row; PAD and future tokens do not")
def g2() -> tuple[str, bool]:
    model = seeded_model(17)
    units = [*ex.SIX_UNITS, ex.PAD, ex.PAD]
    src = source_ids(units)
    src_pad = src == 0
    tgt = target_ids([*ex.SIX_TARGET_PREFIX, "her"])
    g = len(ex.SIX_TARGET_PREFIX) - 1                                         # the `gave` row predicts her
    with torch.no_grad():
        base = model(src, tgt, src_pad=src_pad)[0, g]
        she_he = src.clone()
        she_he[0, units.index("她")] = ex.SOURCE_VOCAB["他"]
        source = _diff(model(she_he, tgt, src_pad=src_pad)[0, g], base)
        pad_row = src.clone()
        pad_row[0, -1] = ex.SOURCE_VOCAB["书"]                               # still flagged PAD
        pad = _diff(model(pad_row, tgt, src_pad=src_pad)[0, g], base)
        future = tgt.clone()
        future[0, -1] = ex.TARGET_VOCAB["him"]
        ahead = _diff(model(src, future, src_pad=src_pad)[0, g], base)
    her, him = float(base[ex.TARGET_VOCAB["her"]]), float(base[ex.TARGET_VOCAB["him"]])
    return (f"gave row logits move: 她→他 in the source {source:.3f}, a PAD source row {_e(pad)}, "
            f"a future target token {_e(ahead)}; untrained scores her {her:.3f}, him {him:.3f}",
            source > 1e-4 and pad == 0 and ahead == 0)
