"""Chapter C, order and positions: equivariance without positions, sinusoids, relative bias, RoPE."""

from __future__ import annotations

import math

import numpy as np
import torch

from ...model.hooks import probes
from ...model.positions import RotaryEmbedding, sinusoidal_positions
from .. import examples as ex
from .common import EXACT, TABLE, diff, layer, rows, seeded_model, source_ids
from .registry import Reading, check, reading

_PERM = [4, 0, 7, 2, 8, 1, 6, 3, 5]


@check("C1", "no positions, full attention: permuting rows permutes outputs (Y' = PY)")
def equivariance_without_positions() -> Reading:
    model = seeded_model(1, positions="none")
    units = ex.NINE_UNITS
    out, scores = [], []
    for seq in (units, [units[i] for i in _PERM]):
        with torch.no_grad(), model.probes("encoder.0.self_attention.head.0.scores") as trace:
            out.append(model.encode(source_ids(seq))[0])
        scores.append(trace["encoder.0.self_attention.head.0.scores"][0])
    p = torch.tensor(_PERM)
    equi = diff(out[1], out[0][p])
    s_err = diff(scores[1], scores[0][p][:, p])
    invariant = diff(out[1], out[0])
    pooled = diff(out[1].mean(0), out[0].mean(0))
    return reading("|Y' − PY| = {equivariance:Δ}, |S' − PSPᵀ| = {scores:Δ}; not invariant: |Y' − Y| = "
                   "{invariance:.2f}; mean-pooled |Δ| = {pooled:Δ}",
                   equi <= EXACT and s_err <= EXACT and invariant > 1e-2 and pooled <= EXACT,
                   tolerance={"exact": EXACT, "moves": 1e-2}, equivariance=equi, scores=s_err, invariance=invariant,
                   pooled=pooled)


@check("C2", "positions break it: 我给他 ≠ 他给我 beyond a permutation")
def positions_break_symmetry() -> Reading:
    a, b = ("我", "给", "他"), ("他", "给", "我")
    p = torch.tensor([2, 1, 0])
    gaps = {}
    for positions in ("sinusoidal", "none"):
        model = seeded_model(2, positions=positions)
        with torch.no_grad():
            ya, yb = model.encode(source_ids(a))[0], model.encode(source_ids(b))[0]
        gaps[positions] = diff(yb, ya[p])
    model = seeded_model(2)
    with torch.no_grad(), model.probes("encoder.embedding") as trace:
        model.encode(source_ids(a))
    d = model.cfg.d_model
    token = model.src_embed.token.weight[source_ids(a)[0]].detach().numpy()
    pe = np.array([[math.sin(p_ / 10000 ** (2 * (i // 2) / d)) if i % 2 == 0 else
                    math.cos(p_ / 10000 ** (2 * (i // 2) / d)) for i in range(d)] for p_ in range(3)])
    emb = diff(trace["encoder.embedding"][0], token * math.sqrt(d) + pe)
    return reading("|Y(他给我) − P·Y(我给他)| = {with_positions:.3f} with positions, {without:Δ} without; "
                   "X_i = E[x_i]√d + p_i |Δ| = {embedding:Δ}",
                   gaps["sinusoidal"] > 1e-2 and gaps["none"] <= EXACT and emb <= TABLE,
                   tolerance={"moves": 1e-2, "exact": EXACT, "table": TABLE}, with_positions=gaps["sinusoidal"],
                   without=gaps["none"], embedding=emb)


@check("C3", "a causal mask changes visibility: the equivariance argument fails")
def causal_mask_breaks_equivariance() -> Reading:
    enc = layer(6, positions="none")
    x = rows(13, 1, 6, 32)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    gaps = {}
    with torch.no_grad():
        for causal in (False, True):
            gaps[causal] = diff(enc(x[:, perm], causal=causal)[0], enc(x, causal=causal)[0][perm])
    return reading("|Y' − PY| full attention {full:Δ}, causal {causal:.3f}", gaps[False] <= EXACT and gaps[True] > 1e-2,
                   tolerance={"exact": EXACT, "moves": 1e-2}, full=gaps[False], causal=gaps[True])


@check("C4", "PE(p,2r) = sin(p/10000^(2r/d)), PE(p,2r+1) = cos; tokens × √d; learned table the alternative")
def sinusoidal_formula() -> Reading:
    n, d = 50, 32
    table = sinusoidal_positions(n, d, torch.float64).numpy()
    formula = np.zeros((n, d))
    for p in range(n):
        for r in range(d // 2):
            formula[p, 2 * r] = math.sin(p / 10000 ** (2 * r / d))
            formula[p, 2 * r + 1] = math.cos(p / 10000 ** (2 * r / d))
    err = diff(table, formula)
    model = seeded_model(3)
    ids = source_ids(ex.NINE_UNITS)
    with torch.no_grad():
        emb = model.src_embed(ids)[0].numpy()
    tok = model.src_embed.token.weight[ids[0]].detach().numpy() * math.sqrt(model.cfg.d_model)
    scaled = diff(emb, tok + formula[:9])
    learned = seeded_model(3, positions="learned").src_embed.learned
    learned_ok = learned is not None and learned.table.weight.requires_grad and \
        tuple(learned.table.weight.shape) == (model.cfg.max_len, d)
    return reading("table vs formula |Δ| = {formula:Δ}; embedding = E·√d + PE |Δ| = {embedding:Δ}; "
                   "learned table {learned}", err <= 1e-12 and scaled <= TABLE and learned_ok,
                   tolerance={"formula": 1e-12, "table": TABLE}, formula=err, embedding=scaled,
                   learned="trainable" if learned_ok else "missing")


@check("C5", "relative bias b_{i−j}: depends on the offset only")
def relative_bias_by_offset() -> Reading:
    mha = layer(7, positions="relative", relative_clip=3).self_attention
    with torch.no_grad(), probes(mha, "head.*.scores", "head.*.scaled_scores") as trace:
        mha(rows(14, 1, 7, 32))
    toeplitz, spread, table = 0.0, math.inf, 0.0
    for h in range(mha.heads):
        bias = (trace[f"head.{h}.scaled_scores"] - trace[f"head.{h}.scores"] / math.sqrt(mha.d_k))[0].numpy()
        toeplitz = max(toeplitz, float(np.max(np.abs(bias[1:, 1:] - bias[:-1, :-1]))))
        spread = min(spread, float(bias.max() - bias.min()))
        want = np.array([[mha.relative.bias[h, max(-3, min(3, i - j)) + 3].item() for j in range(7)]
                         for i in range(7)])
        table = max(table, diff(bias, want))
    return reading("S − QKᵀ/√d_k: |b[i+1,j+1] − b[i,j]| = {toeplitz:Δ}; equals b_(i−j) |Δ| = {table:Δ}; "
                   "offsets differ by ≥ {spread:.3f}", toeplitz <= EXACT and table <= EXACT and spread > 1e-4,
                   tolerance={"exact": EXACT, "differs": 1e-4}, toeplitz=toeplitz, table=table, spread=spread)


@check("C6", "RoPE: q̃_i·k̃_j depends on j − i only; rotates Q/K in every layer")
def rope_by_offset() -> Reading:
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
    plain_embedding = diff(emb, model.src_embed.token.weight[ids] * math.sqrt(model.cfg.d_model))
    rotated_layers = 0
    for i, enc_layer in enumerate(model.encoder.layers):
        with torch.no_grad():
            unrotated = enc_layer.self_attention.project(trace[f"encoder.{i}.sublayer.0.input"])[0][:, 0]
        got = trace[f"encoder.{i}.self_attention.head.0.q"]
        norms = diff(got.reshape(1, 9, -1, 2).norm(dim=-1), unrotated.reshape(1, 9, -1, 2).norm(dim=-1))
        if diff(got[:, 0], unrotated[:, 0]) <= EXACT and diff(got, unrotated) > 1e-3 and norms <= EXACT:
            rotated_layers += 1
    n_layers = len(model.encoder.layers)
    return reading("shift (i,j)→(i+5,j+5) |Δ dot| = {shift:Δ}; = qᵀR((j−i)θ)k |Δ| = {formula:Δ}; "
                   "{frequencies} frequencies; Q rotated in {rotated}/{layers} layers; "
                   "embedding has no position vector |Δ| = {embedding:Δ}",
                   worst_shift <= EXACT and worst_formula <= EXACT and rotated_layers == n_layers
                   and plain_embedding <= EXACT and len(set(theta.tolist())) > 1, tolerance={"exact": EXACT},
                   shift=worst_shift, formula=worst_formula, frequencies=len(theta), rotated=rotated_layers,
                   layers=n_layers, embedding=plain_embedding)


