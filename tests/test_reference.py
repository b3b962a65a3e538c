"""The float64 NumPy reference against the lesson's own code and printed numbers, and its edge cases."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from glassformer.lesson import examples as ex
from glassformer.lesson.reference import attention_head, layer_norm, max_difference, run_reference, softmax_over_keys


def lesson_code():
    """The lesson's printed program, line for line (its `head` and `ln`), returning every row."""
    X, WQ1, WK1, WV1 = (np.array(m, dtype=np.float64) for m in (ex.X, ex.W_Q1, ex.W_K1, ex.W_V1))
    WQ2, WK2, WV2, WO = (np.array(m, dtype=np.float64) for m in (ex.W_Q2, ex.W_K2, ex.W_V2, ex.W_O))
    W1, W2 = np.array(ex.W_1, dtype=np.float64), np.array(ex.W_2, dtype=np.float64)
    epsilon = 1e-05

    def head(Q, K, V):
        S = Q @ K.T / np.sqrt(Q.shape[-1])
        A = np.exp(S - S.max(axis=-1, keepdims=True))
        A /= A.sum(axis=-1, keepdims=True)
        return A, A @ V

    def ln(H):
        mean = H.mean(axis=-1, keepdims=True)
        var = ((H - mean)**2).mean(axis=-1, keepdims=True)
        return (H - mean) / np.sqrt(var + epsilon)

    A1, H1 = head(X @ WQ1, X @ WK1, X @ WV1)
    A2, H2 = head(X @ WQ2, X @ WK2, X @ WV2)
    attention = np.concatenate([H1, H2], axis=-1) @ WO
    U = ln(X + attention)
    ffn = np.maximum(U @ W1, 0) @ W2
    Z = ln(U + ffn)
    return {"A1": A1, "A2": A2, "H1": H1, "H2": H2, "attention": attention, "U": U, "ffn": ffn, "Z": Z}


def test_reference_equals_the_lessons_program_on_every_row():
    want = lesson_code()
    r = run_reference(ex.block_spec())
    got = {"A1": r["self_attention"]["heads"][0]["weights"], "A2": r["self_attention"]["heads"][1]["weights"],
           "H1": r["self_attention"]["heads"][0]["output"], "H2": r["self_attention"]["heads"][1]["output"],
           "attention": r["self_attention"]["output"], "U": r["sublayers"][0]["normed"],
           "ffn": r["ffn"]["output"], "Z": r["output"]}
    for key, value in want.items():
        assert np.allclose(got[key], value, atol=1e-14, rtol=0), key


def test_reference_gives_the_printed_row_one():
    r = run_reference(ex.block_spec())
    stages = {"head1": r["self_attention"]["heads"][0]["output"][0],
              "head2": r["self_attention"]["heads"][1]["output"][0],
              "mha": r["self_attention"]["output"][0], "x_plus_mha": r["sublayers"][0]["residual"][0],
              "ln1": r["sublayers"][0]["normed"][0], "ffn_hidden": r["ffn"]["hidden"][0],
              "ffn": r["ffn"]["output"][0], "ln2": r["output"][0]}
    for key, printed in ex.BLOCK_ROW1.items():
        assert np.allclose(stages[key], printed, atol=5e-7, rtol=0), key


def test_reference_exercise_numbers():
    r = run_reference(ex.exercise_spec(scale=False))
    assert np.allclose(r["weights"], ex.EXERCISE_WEIGHTS, atol=5e-7)
    assert np.allclose(r["output"], ex.EXERCISE_OUTPUT, atol=5e-7)
    scaled = run_reference(ex.exercise_spec(scale=True))
    assert abs(scaled["scaled_scores"][0][0] - ex.EXERCISE_SCALED_ONE) < 5e-7


def test_softmax_over_keys_rows_and_empty_rows():
    rng = np.random.default_rng(0)
    s = rng.standard_normal((4, 5))
    visible = np.ones((4, 5), bool)
    visible[1, 3:] = False
    visible[2] = False
    w = softmax_over_keys(s, visible)
    assert np.allclose(w[[0, 1, 3]].sum(1), 1) and np.all(w[2] == 0) and np.all(w[1, 3:] == 0)
    e = np.exp(s[0])
    assert np.allclose(w[0], e / e.sum())
    assert not np.allclose(w.sum(0), 1)


def test_attention_head_masks_and_scales():
    q = np.array([[1.0, 0.0], [0.0, 2.0]])
    k = np.array([[1.0, 1.0], [2.0, 0.0]])
    v = np.array([[1.0], [3.0]])
    out = attention_head(q, k, v, np.array([[True, False], [True, True]]), scale=True)
    assert out["scaled_scores"][0][1] == -np.inf and np.isclose(out["scaled_scores"][1][0], 2 / np.sqrt(2))
    assert out["output"][0][0] == 1.0


def test_layer_norm_per_row():
    x = np.array([[1.0, 2.0, 3.0, 6.0], [10.0, 0.0, -10.0, 0.0]])
    y = layer_norm(x, np.ones(4), np.zeros(4), 0.0)
    assert np.allclose(y.mean(1), 0) and np.allclose(y.var(1), 1)
    x2 = x.copy()
    x2[1] *= 7
    assert np.array_equal(layer_norm(x2, np.ones(4), np.zeros(4), 1e-5)[0], layer_norm(x, np.ones(4), np.zeros(4),
                                                                                         1e-5)[0])
    g, b = np.array([2.0, 1.0, 1.0, 1.0]), np.array([0.0, 0.0, 0.0, 5.0])
    assert np.allclose(layer_norm(x, g, b, 0.0)[:, 0], 2 * y[:, 0]) and np.allclose(layer_norm(x, g, b, 0.0)[:, 3],
                                                                                      y[:, 3] + 5)


def test_max_difference_structure():
    assert max_difference({"a": [1.0, None]}, {"a": [1.5, None]}) == 0.5
    assert max_difference({"a": [1.0]}, {"a": [1.0, 2.0]}) == np.inf
    assert max_difference({"a": None}, {"a": 0.0}) == np.inf
    assert max_difference({"a": 1.0}, {"b": 1.0}) == np.inf


def test_reference_imports_no_torch_and_no_model():
    code = ("import sys, glassformer.lesson.reference, glassformer.lesson.examples; "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('glassformer.model')]; "
            "sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
