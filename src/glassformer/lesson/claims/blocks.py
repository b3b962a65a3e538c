"""Chapter B, multi-head attention and the block: per-head projections, W^O, the BLOCK's numbers, the norms."""

from __future__ import annotations

import math

import numpy as np
import torch

from ...model.config import ModelConfig
from ...model.hooks import probes
from ...model.layers import ResidualNorm
from ...model.transformer import Transformer
from .. import examples as ex
from ..reference import layer_norm, max_difference, run_reference
from .common import EXACT, TOL, array, block, diff, layer, rows
from .registry import Reading, check, reading


@check("B1", "each head has its own W_r^Q, W_r^K, W_r^V and its own table")
def heads_have_own_projections() -> Reading:
    heads = block()["self_attention"]["heads"]
    apart = diff(heads[0]["weights"], heads[1]["weights"])
    lesson = max(diff(heads[0]["output"][0], ex.BLOCK_ROW1["head1"]),
                 diff(heads[1]["output"][0], ex.BLOCK_ROW1["head2"]))
    return reading("head tables differ by up to {apart:.3f}; row 1: head 1 ({h1[0]:.6f}, {h1[1]:.6f}), "
                   "head 2 ({h2[0]:.6f}, {h2[1]:.6f}), |Δ| vs lesson {lesson:Δ}", apart > 0.05 and lesson <= TOL,
                   tolerance={"tables_differ": 0.05, "lesson": TOL}, apart=apart, h1=list(heads[0]["output"][0]),
                   h2=list(heads[1]["output"][0]), lesson=lesson)


@check("B2", "Concat(H_1..H_H) is n×(H·d_v); W^O brings it back to n×d")
def concat_then_output_projection() -> Reading:
    sa = block()["self_attention"]
    concat, out = array(sa["concat"]), array(sa["output"])
    parts = np.concatenate([array(h["output"]) for h in sa["heads"]], axis=1)
    err = max(diff(concat, parts), diff(out, concat @ array(ex.W_O)))
    lesson = diff(out[0], ex.BLOCK_ROW1["mha"])
    return reading("concat {concat[0]}×{concat[1]}, MHA {mha[0]}×{mha[1]}; |MHA − concat·W^O| = {err:Δ}; "
                   "row 1 ({row1[0]:.6f}, {row1[1]:.6f}, {row1[2]:.6f}, {row1[3]:.6f}) |Δ| {lesson:Δ}",
                   concat.shape == (3, 4) and out.shape == array(ex.X).shape and err <= EXACT and lesson <= TOL,
                   tolerance={"exact": EXACT, "lesson": TOL}, concat=list(concat.shape), mha=list(out.shape),
                   err=err, row1=out[0].tolist(), lesson=lesson)


@check("B3", "the BLOCK's numbers: every printed stage of row 1, all three rows computed")
def block_numbers() -> Reading:
    r = block()
    got = {"head1": r["self_attention"]["heads"][0]["output"][0], "head2": r["self_attention"]["heads"][1]["output"][0],
           "mha": r["self_attention"]["output"][0], "x_plus_mha": r["sublayers"][0]["residual"][0],
           "ln1": r["sublayers"][0]["normed"][0], "ffn_hidden": r["ffn"]["hidden"][0],
           "ffn": r["ffn"]["output"][0], "ln2": r["output"][0]}
    lesson = max(diff(got[k], v) for k, v in ex.BLOCK_ROW1.items())
    all_rows = max_difference(r, run_reference(ex.block_spec()))
    return reading("Z row 1 = ({z[0]:.6f}, {z[1]:.6f}, {z[2]:.6f}, {z[3]:.6f}); {stages} stages vs lesson "
                   "max |Δ| = {lesson:Δ}; {rows} rows vs reference {reference:Δ}",
                   lesson <= TOL and all_rows <= EXACT and len(r["output"]) == 3,
                   tolerance={"lesson": TOL, "exact": EXACT}, z=list(r["output"][0]), stages=len(ex.BLOCK_ROW1),
                   lesson=lesson, rows=len(r["output"]), reference=all_rows)


@check("B4", "post-norm: U = LN₁(X + MHA(X)), Z = LN₂(U + FFN(U)); pre-norm the alternative")
def post_norm_placement() -> Reading:
    ones, zeros = np.ones(4), np.zeros(4)
    post, pre = block(norm="post"), block(norm="pre")
    x = array(ex.X)
    u = layer_norm(x + array(post["self_attention"]["output"]), ones, zeros, ex.EPS)
    z = layer_norm(u + array(post["ffn"]["output"]), ones, zeros, ex.EPS)
    err_post = max(diff(post["sublayers"][0]["normed"], u), diff(post["sublayers"][1]["input"], u),
                   diff(post["output"], z))
    x_ln = layer_norm(x, ones, zeros, ex.EPS)
    err_pre = max(diff(pre["sublayers"][0]["normed"], x_ln),
                  diff(pre["sublayers"][0]["residual"], x + array(pre["self_attention"]["output"])),
                  diff(pre["output"], pre["sublayers"][1]["residual"]))
    finals = {norm: Transformer(ModelConfig.tiny(norm_placement=norm, src_vocab=4, tgt_vocab=4)).encoder.norm
              is not None for norm in ("post", "pre")}
    # dropout acts on Sub(x) before the residual add: x itself is never dropped
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        rn = ResidualNorm(8, 1e-5, "post", dropout=0.5).double().train()
        xin, c = rows(1, 1, 6, 8), torch.full((1, 6, 8), 3.0, dtype=torch.float64)
        with probes(rn, "residual") as trace:
            rn(xin, lambda h: c)
    added = (trace["residual"] - xin).numpy()
    dropout_ok = bool(np.all(np.isclose(added, 0.0) | np.isclose(added, 6.0))) and bool(np.any(np.isclose(added, 0)))
    return reading("post |Δ| = {post:Δ}, pre |Δ| = {pre:Δ}; stack final LN: post {final_post}, pre {final_pre}; "
                   "dropout on Sub(x) only: {dropout}",
                   err_post <= EXACT and err_pre <= EXACT and finals == {"post": False, "pre": True} and dropout_ok,
                   tolerance={"exact": EXACT}, post=err_post, pre=err_pre, final_post=finals["post"],
                   final_pre=finals["pre"], dropout=dropout_ok)


@check("B5", "LayerNorm per token: other rows and other sentences change nothing")
def layer_norm_per_token() -> Reading:
    enc = layer(3)
    norm = enc.sublayer[0].layer_norm
    with torch.no_grad():
        norm.weight.copy_(rows(4, 32))
        norm.bias.copy_(rows(5, 32))
        x = rows(6, 2, 5, 32)                                                # (batch, len, d)
        y = norm(x)
        formula = layer_norm(x[0].numpy(), norm.weight.numpy(), norm.bias.numpy(), norm.eps)
        x_other = x.clone()
        x_other[0, 1:] += rows(7, 4, 32) * 3
        x_other[1] = rows(8, 5, 32)
        row_moved = diff(norm(x_other)[0, 0], y[0, 0])
        whole = enc(x)
        x_batch = x.clone()
        x_batch[1] = rows(9, 5, 32) * 2
        sentence_moved = diff(enc(x_batch)[0], whole[0])
    err = diff(y[0], formula)
    return reading("LN vs γ⊙(x−μ)/√(σ²+ε)+β per row |Δ| = {formula:Δ}; other rows changed: row 1 moves {row:Δ}; "
                   "other sentence changed: encoder layer output moves {sentence:Δ}",
                   err <= EXACT and row_moved <= EXACT and sentence_moved <= EXACT, tolerance={"exact": EXACT},
                   formula=err, row=row_moved, sentence=sentence_moved)


@check("B6", "FFN = ReLU(xW₁+b₁)W₂+b₂, same weights at every row, each row alone")
def ffn_per_row() -> Reading:
    ffn = layer(4).ffn
    with torch.no_grad():
        x = rows(10, 1, 6, 32)
        x[0, 4] = x[0, 1]                                                    # the same row at two positions
        y = ffn(x)
        w1, b1 = ffn.w_1.weight.numpy().T, ffn.w_1.bias.numpy()
        w2, b2 = ffn.w_2.weight.numpy().T, ffn.w_2.bias.numpy()
        formula = np.maximum(x[0].numpy() @ w1 + b1, 0) @ w2 + b2
        x_other = x.clone()
        x_other[0, 2:] = rows(11, 4, 32)
        moved = diff(ffn(x_other)[0, :2], y[0, :2])
    err, same = diff(y[0], formula), diff(y[0, 4], y[0, 1])
    return reading("|FFN − formula| = {formula:Δ}; equal rows → equal outputs {same:Δ}; other rows changed: {moved:Δ}",
                   err <= EXACT and same <= EXACT and moved == 0, tolerance={"exact": EXACT},
                   formula=err, same=same, moved=moved)


@check("B7", "d(x+F(x))/dx = I + J_F; the block's gradient is not identically 1")
def residual_gradient() -> Reading:
    enc = layer(5)
    sub, ffn = enc.sublayer[1], enc.ffn
    u = rows(12, 1, 1, 32)
    jac = torch.autograd.functional.jacobian
    j_f = jac(lambda t: ffn(t), u).reshape(32, 32)
    j_res = jac(lambda t: t + ffn(t), u).reshape(32, 32)
    j_block = jac(lambda t: sub(t, ffn), u).reshape(32, 32)                   # post-norm: LN(u + FFN(u))
    eye = torch.eye(32, dtype=torch.float64)
    direct = diff(j_res, eye + j_f)
    off_identity = diff(j_res, eye)
    ln_effect = diff(j_block, eye + j_f)
    return reading("|J(x+F) − (I+J_F)| = {direct:Δ}; |J(x+F) − I| = {off_identity:.3f}; "
                   "with the LN after it |J − (I+J_F)| = {with_norm:.3f}",
                   direct <= EXACT and off_identity > 1e-2 and ln_effect > 1e-2,
                   tolerance={"exact": EXACT, "differs": 1e-2}, direct=direct, off_identity=off_identity,
                   with_norm=ln_effect)


@check("B8", "a switched-off head removes exactly its contribution before W^O")
def switched_off_head() -> Reading:
    full = block()["self_attention"]
    worst, moved = 0.0, math.inf
    for off in (0, 1):
        keep = 1 - off
        sa = block(disabled_heads=[off])["self_attention"]
        concat = array(sa["concat"])
        w_o_keep = array(ex.W_O)[2 * keep: 2 * keep + 2]
        worst = max(worst, diff(sa["heads"][keep]["output"], full["heads"][keep]["output"]),
                    float(np.max(np.abs(concat[:, 2 * off: 2 * off + 2]))),
                    diff(sa["output"], array(full["heads"][keep]["output"]) @ w_o_keep))
        moved = min(moved, diff(sa["output"], full["output"]))
    return reading("other head unchanged, its columns zero, MHA = H_kept·W^O rows: max |Δ| = {worst:Δ}; "
                   "output moves by ≥ {moved:.3f}", worst <= EXACT and moved > 1e-2,
                   tolerance={"exact": EXACT, "moves": 1e-2}, worst=worst, moved=moved)
