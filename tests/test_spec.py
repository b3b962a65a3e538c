"""Trace spec v1: the lesson's BLOCK, agreement with the float64 reference, and every error class."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest

from glassformer import limits
from glassformer.errors import UsageError
from glassformer.lesson.examples import block_spec
from glassformer.lesson.reference import max_difference, run_reference
from glassformer.lesson.spec import SpecError, run_spec, validate_spec
from glassformer.limits import LimitError

DATA = Path(__file__).parent / "data"


def load(name: str) -> dict:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


# ---- the acceptance numbers -------------------------------------------------------------------

def test_block_fixture_gives_the_lessons_row_one():
    r = run_spec(load("block.json"))
    assert np.allclose(r["output"][0], [1.233154, 0.588798, -0.424732, -1.397220], atol=5e-7)
    assert np.allclose(r["self_attention"]["heads"][0]["output"][0], [0.401112, 0.796664], atol=5e-7)
    assert np.allclose(r["self_attention"]["heads"][1]["output"][0], [0.598888, 0.802224], atol=5e-7)
    assert len(r["output"]) == 3 and [s["name"] for s in r["sublayers"]] == ["self_attention", "ffn"]


def test_exercise_fixture_unscaled_numbers():
    r = run_spec(load("exercise.json"))
    assert r["scores"] == [[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]
    assert np.allclose(r["weights"], [[.422319, .155362, .422319], [.155362, .422319, .422319]], atol=5e-7)
    assert np.allclose(r["output"], [[1.266956, 1.466087], [.733044, 2.533913]], atol=5e-7)


def test_fixture_is_the_block_spec():
    assert load("block.json") == block_spec()


def test_decoder_fixture_masks():
    r = run_spec(load("decoder_block.json"))
    self_w = np.array(r["self_attention"]["heads"][0]["weights"])
    cross_w = np.array(r["cross_attention"]["heads"][1]["weights"])
    assert self_w[0, 1] == 0 and self_w[0, 0] == 1.0                       # causal: row 0 sees itself only
    assert np.all(cross_w[:, 2] == 0) and np.allclose(cross_w.sum(1), 1)    # memory PAD never read
    assert r["cross_attention"]["heads"][0]["scaled_scores"][1][2] is None
    assert [s["name"] for s in r["sublayers"]] == ["self_attention", "cross_attention", "ffn"]
    assert max_difference(r, run_reference(load("decoder_block.json"))) < 1e-12


# ---- random specs against the reference -------------------------------------------------------

def _m(rng, r, c):
    return rng.standard_normal((r, c)).round(3).tolist()


def _heads(rng, n_heads, d, d_k, d_v, biases):
    out = []
    for _ in range(n_heads):
        h = {"w_q": _m(rng, d, d_k), "w_k": _m(rng, d, d_k), "w_v": _m(rng, d, d_v)}
        if biases:
            h.update(b_q=rng.standard_normal(d_k).tolist(), b_k=rng.standard_normal(d_k).tolist(),
                     b_v=rng.standard_normal(d_v).tolist())
        out.append(h)
    att = {"heads": out, "w_o": _m(rng, n_heads * d_v, d)}
    if biases:
        att["b_o"] = rng.standard_normal(d).tolist()
    return att


def _bools(rng, shape, p):
    return (rng.random(shape) < p).tolist()


def random_spec(seed: int) -> dict:
    """A valid spec exercising one mix of kind, placement, masks, padding, heads, biases and scale."""
    rng = np.random.default_rng(seed)
    kind = ("attention", "encoder_block", "decoder_block")[seed % 3]
    n, m = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    d_k, d_v = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    doc: dict = {"version": 1, "kind": kind}
    if rng.random() < 0.8:
        doc["scale"] = bool(rng.random() < 0.6)
    mask_choice = rng.integers(0, 4)
    if kind == "attention":
        doc.update(q=_m(rng, n, d_k), k=_m(rng, m, d_k), v=_m(rng, m, d_v))
    else:
        m = n
        d, n_heads, biases = int(rng.integers(2, 6)), int(rng.integers(1, 4)), bool(rng.random() < 0.5)
        doc["x"] = _m(rng, n, d)
        doc["self_attention"] = _heads(rng, n_heads, d, d_k, d_v, biases)
        d_ff = int(rng.integers(1, 8))
        doc["ffn"] = {"w_1": _m(rng, d, d_ff), "w_2": _m(rng, d_ff, d)}
        if biases:
            doc["ffn"].update(b_1=rng.standard_normal(d_ff).tolist(), b_2=rng.standard_normal(d).tolist())
        doc["norm"] = ("post", "pre")[int(rng.integers(0, 2))]
        doc["eps"] = float(10 ** rng.uniform(-7, -1))
        n_sub = 2
        if kind == "decoder_block":
            n_sub, m_mem = 3, int(rng.integers(1, 6))
            doc["memory"] = _m(rng, m_mem, d)
            doc["cross_attention"] = _heads(rng, int(rng.integers(1, 4)), d, int(rng.integers(1, 4)),
                                            int(rng.integers(1, 4)), biases)
            if rng.random() < 0.6:
                doc["memory_padding"] = _bools(rng, m_mem, 0.3)
        if rng.random() < 0.5:
            doc["layer_norms"] = [{"gamma": (1 + 0.3 * rng.standard_normal(d)).tolist(),
                                   "beta": rng.standard_normal(d).tolist()} for _ in range(n_sub)]
        if rng.random() < 0.5:
            doc["disabled_heads"] = sorted(set(rng.integers(0, n_heads, size=int(rng.integers(1, 3))).tolist()))
    if mask_choice == 1:
        doc["mask"] = "causal"
    elif mask_choice == 2:
        doc["mask"] = _bools(rng, (n, m), 0.7)
    elif mask_choice == 3:
        doc["mask"] = "none"
    if rng.random() < 0.5:
        doc["key_padding"] = _bools(rng, m, 0.3)
    return doc


@pytest.mark.parametrize("seed", range(30))
def test_run_spec_equals_reference(seed):
    doc = random_spec(seed)
    before = copy.deepcopy(doc)
    got, want = run_spec(doc), run_reference(doc)
    assert doc == before                                                    # the input is not modified
    assert max_difference(got, want) <= 1e-8


def test_random_specs_cover_every_switch():
    docs = [random_spec(s) for s in range(30)]
    blocks = [d for d in docs if d["kind"] != "attention"]
    assert {d["kind"] for d in docs} == {"attention", "encoder_block", "decoder_block"}
    assert {d["norm"] for d in blocks} == {"post", "pre"}
    assert any(d.get("disabled_heads") for d in blocks)
    assert {len(d["self_attention"]["heads"]) for d in blocks} == {1, 2, 3}
    assert any(d.get("scale") is False for d in docs) and any(d.get("scale", True) for d in docs)
    assert any("b_q" in d["self_attention"]["heads"][0] for d in blocks)
    assert any("b_q" not in d["self_attention"]["heads"][0] for d in blocks)
    assert any(isinstance(d.get("mask"), list) for d in docs) and any(d.get("mask") == "causal" for d in docs)
    assert any("key_padding" in d for d in docs) and any("memory_padding" in d for d in docs)
    assert any(len(d["self_attention"]["heads"][0]["w_q"][0]) != len(d["self_attention"]["heads"][0]["w_v"][0])
               for d in blocks)


def test_reference_detects_a_wrong_number():
    doc = random_spec(4)
    got = run_spec(doc)
    got["output"][0][0] += 1e-6
    assert max_difference(got, run_reference(doc)) > 5e-7


# ---- the semantics the contract fixes ----------------------------------------------------------

def test_masked_scores_are_null_and_an_empty_row_gives_zeros():
    doc = {**block_spec(), "mask": [[False, False, False], [True, True, False], [True, True, True]]}
    r = run_spec(doc)
    head = r["self_attention"]["heads"][0]
    assert head["scaled_scores"][0] == [None, None, None] and head["scaled_scores"][1][2] is None
    assert head["weights"][0] == [0.0, 0.0, 0.0] and head["output"][0] == [0.0, 0.0]
    assert math.isclose(sum(head["weights"][1]), 1.0) and head["weights"][1][2] == 0.0
    assert head["scores"][0][0] == 1.0                                       # raw scores stay numbers
    json.dumps(r, allow_nan=False)


def test_key_padding_and_causal_combine():
    r = run_spec({**block_spec(), "mask": "causal", "key_padding": [True, False, False]})
    w = np.array(r["self_attention"]["heads"][1]["weights"])
    assert np.all(w[0] == 0)                                                # row 0 sees only key 0, a PAD
    assert w[1, 0] == 0 and w[1, 2] == 0 and w[1, 1] == 1.0
    assert w[2, 0] == 0 and math.isclose(w[2, 1] + w[2, 2], 1.0)


def test_switched_off_head_zeroes_its_concat_columns_only():
    full = run_spec(block_spec())["self_attention"]
    off = run_spec({**block_spec(), "disabled_heads": [0]})["self_attention"]
    concat = np.array(off["concat"])
    assert np.all(concat[:, :2] == 0) and np.array_equal(concat[:, 2:], np.array(full["concat"])[:, 2:])
    assert off["heads"][0]["disabled"] and not off["heads"][1]["disabled"]


def test_scale_false_leaves_scores():
    r = run_spec({**block_spec(), "scale": False})
    head = r["self_attention"]["heads"][0]
    assert head["scaled_scores"] == head["scores"]


def test_pre_norm_block_has_no_final_norm():
    r = run_spec(block_spec("pre"))
    assert r["output"] == r["sublayers"][1]["residual"]
    assert r["sublayers"][0]["input"] == block_spec()["x"]


def test_output_is_plain_json_floats():
    r = run_spec(block_spec())
    values = r["self_attention"]["heads"][0]["weights"][0] + r["output"][1]
    assert all(type(v) is float for v in values)
    assert json.loads(json.dumps(r)) == r


def test_validate_fills_defaults():
    doc = block_spec()
    for key in ("norm", "eps", "scale", "mask"):
        doc.pop(key)
    spec = validate_spec(doc)
    assert spec["norm"] == "post" and spec["eps"] == 1e-5 and spec["scale"] is True and spec["mask"] == "none"
    assert spec["disabled_heads"] == [] and len(spec["layer_norms"]) == 2
    assert np.array_equal(spec["self_attention"]["heads"][1]["b_v"], np.zeros(2))
    assert run_spec(doc) == run_spec(block_spec())


def test_zero_eps_is_allowed():
    assert run_spec({**block_spec(), "eps": 0})["output"][0][0] > 1.2


# ---- errors: one line naming the field and the shapes ------------------------------------------

def _with(path: str, value):
    """block_spec() with one field replaced (dotted path, [i] for list items); value DELETE removes it."""
    doc = block_spec()
    parts = path.replace("[", ".").replace("]", "").split(".")
    node = doc
    for p in parts[:-1]:
        node = node[int(p)] if p.isdigit() else node[p]
    last = int(parts[-1]) if parts[-1].isdigit() else parts[-1]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return doc


DELETE = object()

BAD = [
    # (document, words the message must contain)
    pytest.param([1, 2], ["spec", "JSON object"], id="not-an-object"),
    pytest.param(_with("x", DELETE), ["x: missing required key"], id="missing-x"),
    pytest.param(_with("self_attention.heads[0].w_k", DELETE), ["self_attention.heads[0].w_k: missing"],
                 id="missing-w_k"),
    pytest.param(_with("colour", "red"), ["colour", "unknown key"], id="unknown-top"),
    pytest.param(_with("ffn.w_3", [[1.0]]), ["ffn.w_3", "unknown key"], id="unknown-nested"),
    pytest.param(_with("self_attention.heads[1].b_x", [1.0]), ["self_attention.heads[1].b_x", "unknown"],
                 id="unknown-in-head"),
    pytest.param(_with("version", 2), ["version", "expected 1"], id="version"),
    pytest.param(_with("version", True), ["version"], id="version-bool"),
    pytest.param(_with("kind", "mlp"), ["kind", "'mlp'"], id="kind"),
    pytest.param(_with("norm", "middle"), ["norm", "'middle'"], id="norm"),
    pytest.param(_with("mask", "triangle"), ["mask", "'triangle'"], id="mask-word"),
    pytest.param(_with("ffn.activation", "gelu"), ["ffn.activation", "'gelu'"], id="activation"),
    pytest.param(_with("eps", -1e-5), ["eps", "negative", "-1e-05"], id="negative-eps"),
    pytest.param(_with("x", []), ["x: empty"], id="no-rows"),
    pytest.param(_with("self_attention.heads", []), ["self_attention.heads: empty"], id="no-heads"),
    pytest.param(_with("x", [[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0]]), ["x[1]", "ragged"], id="ragged"),
    pytest.param(_with("self_attention.heads[1].w_k", [[0.0] * 3] * 4),
                 ["self_attention.heads[1].w_k", "expected 4×2 (d×d_k)", "got 4×3"], id="d_k-mismatch"),
    pytest.param(_with("self_attention.heads[0].w_q", [[0.0] * 2] * 3),
                 ["self_attention.heads[0].w_q", "expected 4×?", "got 3×2"], id="d-mismatch"),
    pytest.param(_with("self_attention.heads[1].w_v", [[0.0] * 3] * 4),
                 ["self_attention.heads[1].w_v", "4×2", "4×3"], id="d_v-mismatch"),
    pytest.param(_with("self_attention.w_o", [[0.0] * 4] * 3),
                 ["self_attention.w_o", "expected 4×4", "got 3×4"], id="w_o"),
    pytest.param(_with("ffn.w_2", [[0.0] * 4] * 5), ["ffn.w_2", "expected 6×4 (d_ff×d)", "got 5×4"], id="ffn"),
    pytest.param(_with("ffn.b_1", [0.0] * 4), ["ffn.b_1", "length 6", "got 4"], id="ffn-bias"),
    pytest.param(_with("self_attention.heads[0].b_q", [0.0] * 3), ["self_attention.heads[0].b_q", "length 2"],
                 id="head-bias"),
    pytest.param(_with("layer_norms", [{}]), ["layer_norms", "expected 2", "got 1"], id="layer-norm-count"),
    pytest.param(_with("layer_norms", [{}, {"gamma": [1.0] * 3}]), ["layer_norms[1].gamma", "length 4"],
                 id="layer-norm-length"),
    pytest.param(_with("mask", [[True] * 3] * 2), ["mask", "3×3"], id="mask-shape"),
    pytest.param(_with("mask", [[True, 1, True]] * 3), ["mask[0][1]", "true/false"], id="mask-number"),
    pytest.param(_with("key_padding", [False, False]), ["key_padding", "length 3", "got 2"], id="key-padding"),
    pytest.param(_with("x[0][1]", float("nan")), ["x[0][1]", "non-finite"], id="nan"),
    pytest.param(_with("self_attention.w_o[2][0]", float("inf")), ["self_attention.w_o[2][0]", "non-finite"],
                 id="infinity"),
    pytest.param(_with("x[1][0]", True), ["x[1][0]", "expected a number", "boolean"], id="bool-as-number"),
    pytest.param(_with("x[1][0]", "1"), ["x[1][0]", "expected a number"], id="string-as-number"),
    pytest.param(_with("scale", 1), ["scale", "true/false"], id="number-as-bool"),
    pytest.param(_with("key_padding", [0, 0, 1]), ["key_padding[0]", "true/false"], id="number-in-padding"),
    pytest.param(_with("disabled_heads", [2]), ["disabled_heads[0]", "out of range", "H=2"], id="head-range"),
    pytest.param(_with("disabled_heads", [1.0]), ["disabled_heads[0]", "integer"], id="head-not-int"),
    pytest.param(_with("memory_padding", [False]), ["memory_padding", "unknown key"], id="memory-pad-encoder"),
    pytest.param({**block_spec(), "kind": "decoder_block", "memory": [[1.0, 2.0, 3.0]],
                  "cross_attention": block_spec()["self_attention"]},
                 ["memory", "expected ?×4", "got 1×3"], id="memory-width"),
    pytest.param({**load("decoder_block.json"), "memory_padding": [False, True]},
                 ["memory_padding", "length 3", "got 2"], id="memory-padding"),
    pytest.param({"version": 1, "kind": "attention", "q": [[1.0, 0.0]], "k": [[1.0, 0.0, 1.0]],
                  "v": [[1.0]]}, ["k", "expected ?×2", "1×3"], id="attention-d_k"),
    pytest.param({"version": 1, "kind": "attention", "q": [[1.0]], "k": [[1.0], [2.0]], "v": [[1.0]]},
                 ["v", "expected 2×?", "1×1"], id="attention-m"),
    pytest.param({"version": 1, "kind": "attention", "q": [[1.0]], "k": [[1.0]], "v": [[1.0]], "x": [[1.0]]},
                 ["x", "unknown key"], id="block-key-in-attention"),
]


@pytest.mark.parametrize("doc, words", BAD)
def test_errors_name_the_field(doc, words):
    with pytest.raises(SpecError) as info:
        run_spec(doc)
    message = str(info.value)
    assert "\n" not in message
    for w in words:
        assert w in message, f"{w!r} not in {message!r}"


def test_spec_error_is_a_usage_error():
    assert issubclass(SpecError, UsageError)


def test_json_nan_literal_is_rejected():
    doc = json.loads(json.dumps(block_spec()).replace("[1.0, 0.0, 1.0, 0.0]", "[1.0, NaN, 1.0, 0.0]", 1))
    with pytest.raises(SpecError, match=r"x\[0\]\[1\]: non-finite"):
        run_spec(doc)


# ---- the field travels with the error; work limits come before any allocation -------------------

@pytest.mark.parametrize("doc, field", [
    (_with("self_attention.heads[1].w_k", [[0.0] * 3] * 4), "self_attention.heads[1].w_k"),
    (_with("x[1][0]", "1"), "x[1][0]"),
    (_with("mask", [[True, 1, True]] * 3), "mask[0][1]"),
    (_with("ffn.w_3", [[1.0]]), "ffn.w_3"),
    (_with("ffn", DELETE), "ffn"),
    ([1], "spec"),
])
def test_spec_error_carries_the_field(doc, field):
    with pytest.raises(SpecError) as info:
        validate_spec(doc)
    assert info.value.field == field


def _attention(n: int, m: int, d_k: int) -> dict:
    return {"version": 1, "kind": "attention", "q": [[0.5] * d_k] * n, "k": [[0.25] * d_k] * m,
            "v": [[1.0] * d_k] * m}


@pytest.mark.parametrize("doc, limit", [
    (_attention(1, 1, 6000), "MAX_SPEC_WIDTH"),            # one 6,000-number row once took 2 GB
    (_attention(1500, 1500, 1), "MAX_SPEC_ROWS"),          # 1,500 rows once answered 67 MB after 32 s
    (_with("x", [[1.0, 0.0, 1.0, 0.0]] * 300), "MAX_SPEC_ROWS"),
])
def test_work_limits_refuse_before_allocating(doc, limit):
    import tracemalloc
    tracemalloc.start()
    try:
        with pytest.raises(LimitError) as info:
            run_spec(doc)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert limit in str(info.value) and info.value.status == 413
    assert peak < 20 << 20                                  # nothing close to the n×m or d_k² tables


def test_heads_and_elements_limits():
    spec = block_spec()
    spec["self_attention"]["heads"] = spec["self_attention"]["heads"] * 20     # 40 heads
    with pytest.raises(LimitError, match="MAX_SPEC_HEADS"):
        validate_spec(spec)
    with pytest.raises(LimitError, match="MAX_MATRIX_ELEMENTS") as info:        # 200 × 400 = 80,000 numbers
        validate_spec(_attention(200, 2, 400))
    assert info.value.field == "q"


def test_lifted_limits_run_a_larger_spec():
    doc = _attention(300, 2, 1)                             # over MAX_SPEC_ROWS by 44 rows
    with pytest.raises(LimitError):
        run_spec(doc)
    with limits.lifted():
        out = run_spec(doc)
    assert len(out["weights"]) == 300 and out["weights"][0] == [0.5, 0.5]


def _at_the_bound(rng, shape) -> list:
    """Numbers of ±MAX_SPEC_MAGNITUDE, signs at random."""
    return (np.where(rng.random(shape) < 0.5, -1.0, 1.0) * limits.MAX_SPEC_MAGNITUDE).tolist()


@pytest.mark.parametrize("kind", ["encoder_block", "decoder_block"])
def test_numbers_at_the_magnitude_bound_stay_finite_and_agree(kind):
    """At the widest d (MAX_SPEC_WIDTH) and every number ±MAX_SPEC_MAGNITUDE, no intermediate overflows: every
    number of the answer is finite (1e150 in one cell gave null everywhere, and the model's nulls differed from the
    reference's) and the block equals the float64 reference to float rounding."""
    rng, d, n, h = np.random.default_rng(0), limits.MAX_SPEC_WIDTH, 2, 64
    def attention():
        return {"heads": [{w: _at_the_bound(rng, (d, h)) for w in ("w_q", "w_k", "w_v")}],
                "w_o": _at_the_bound(rng, (h, d)), "b_o": _at_the_bound(rng, d)}
    doc = {"version": 1, "kind": kind, "x": _at_the_bound(rng, (n, d)), "self_attention": attention(),
           "ffn": {"w_1": _at_the_bound(rng, (d, h)), "w_2": _at_the_bound(rng, (h, d)),
                   "b_1": _at_the_bound(rng, h)},
           "layer_norms": [{"gamma": _at_the_bound(rng, d), "beta": _at_the_bound(rng, d)}
                           for _ in range(2 if kind == "encoder_block" else 3)], "eps": 0}
    if kind == "decoder_block":
        doc.update(memory=_at_the_bound(rng, (3, d)), cross_attention=attention(), mask="causal")
    got, want = run_spec(doc), run_reference(doc)
    out, ref = np.array(got["output"], dtype=float), np.array(want["output"], dtype=float)
    assert np.isfinite(out).all() and np.abs(out).max() > 1e12
    assert np.allclose(out, ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())
    json.dumps(got, allow_nan=False)


@pytest.mark.parametrize("path, value, shown", [("x[1][2]", 1e150, "1e+150"),
                                                ("self_attention.w_o[3][0]", -2e12, "-2e+12"),
                                                ("ffn.b_1[1]", 1.000001e12, "1.000001e+12"),
                                                ("layer_norms[0].gamma[3]", -1e300, "-1e+300")])
def test_a_number_beyond_the_magnitude_bound_is_one_line(path, value, shown):
    doc = block_spec()
    doc["layer_norms"] = [{"gamma": [1.0] * 4, "beta": [0.0] * 4} for _ in range(2)]
    doc["ffn"]["b_1"] = [0.0] * len(doc["ffn"]["w_1"][0])
    parts = path.replace("[", ".").replace("]", "").split(".")
    node = doc
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node[part]
    node[int(parts[-1])] = value
    with pytest.raises(LimitError) as info:
        run_spec(doc)
    assert str(info.value) == f"{path}: {shown} is beyond ±1e+12 (MAX_SPEC_MAGNITUDE)"
    assert info.value.field == path and info.value.status == 413
    with limits.lifted():                                   # --no-limits: trusted input runs as given
        assert run_spec(doc)["kind"] == "encoder_block"
