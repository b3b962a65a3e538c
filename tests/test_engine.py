"""The page's JavaScript engine (lab/static/engine) against the PyTorch model in float64.

A trained tiny model is written as a bundle (lab/bundle.py) and run through the engine by Node
(tests/engine/run_cases.mjs); the same sentences go through `model.double()` with its hooks. Every probe of
docs/probes.md, the logits after a head is switched off and after a patch, each incremental decoding step,
greedy and beam-4 outputs, the patching table, the logit lens and ALTI+ must agree to 1e-9 (relative to each
value's scale); the trace-spec blocks agree with lesson/reference.py. Planted bugs (a scale applied after the
softmax, a causal mask off by one) in a copy of the engine turn the same comparisons red.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import glassformer
from glassformer.errors import UsageError
from glassformer.lab.bundle import BundleError, read_bundle, write_bundle
from glassformer.lesson import examples
from glassformer.lesson.reference import max_difference, run_reference
from glassformer.lesson.spec import validate_spec
from glassformer.limits import LimitError
from glassformer.model import ModelConfig, Transformer

ENGINE = Path(glassformer.__file__).parent / "lab" / "static" / "engine"
RUNNER = Path(__file__).parent / "engine" / "run_cases.mjs"
NODE = shutil.which("node")
RTOL = 1e-9                     # engine vs PyTorch float64: max |difference| / max |value|, per probe

pytestmark = pytest.mark.skipif(NODE is None, reason="needs Node.js (node) on PATH")


# ---- running the engine ------------------------------------------------------------------------------

def run_engine(folder: Path, bundle: Path | None, cases: list[dict], engine: Path = ENGINE) -> dict:
    """Run `cases` through the engine in `engine` with Node; the runner's JSON ({load_ms, results})."""
    job, out = folder / "job.json", folder / "out.json"
    job.write_text(json.dumps({"bundle": str(bundle) if bundle else None, "cases": cases}))
    done = subprocess.run([NODE, str(RUNNER), str(engine), str(job), str(out)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


def write(folder: Path, bundle: dict, name: str = "bundle.json") -> Path:
    path = folder / name
    path.write_text(json.dumps(bundle))
    return path


def js_array(value: dict) -> np.ndarray:
    """A runner Matrix {rows, cols, data} (null = -inf) as a float64 array."""
    data = [-math.inf if v is None else v for v in value["data"]]
    return np.array(data, dtype=np.float64).reshape(value["rows"], value["cols"])


def relative_error(torch_value: torch.Tensor, js_value: np.ndarray) -> float:
    """max |a - b| / max |a| over the finite entries; inf when the shapes or the -inf entries differ."""
    a = torch_value.detach().double().numpy()
    a = a.astype(np.float64) if a.dtype != np.bool_ else a.astype(np.float64)
    if a.shape != js_value.shape or not (np.isinf(a) == np.isinf(js_value)).all():
        return math.inf
    finite = np.isfinite(a)
    if not finite.any():
        return 0.0
    scale = max(np.abs(a[finite]).max(), 1e-300)
    return float(np.abs(a[finite] - js_value[finite]).max() / scale)


def worst_probe(rec, probes: dict) -> tuple[str, float]:
    """(probe, its relative error) of the worst probe; every recorded probe must be there on both sides."""
    assert set(rec.names()) == set(probes), sorted(set(rec.names()) ^ set(probes))[:6]
    errors = {name: relative_error(rec[name][0], js_array(probes[name])) for name in rec.names()}
    name = max(errors, key=errors.get)
    return name, errors[name]


def off(names: list[str]) -> dict:
    return {f"{name}.output": lambda v, n: torch.zeros_like(v) for name in names}


# ---- a trained tiny model and its bundle --------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tiny_run, tmp_path_factory):
    """(float64 model, source, target tokenizers, float32 model, folder, bundle path) of the tiny run."""
    from glassformer.data.checkpoint import load_translator_parts

    model, source, target, _ = load_translator_parts(tiny_run)
    folder = tmp_path_factory.mktemp("engine")
    bundle = write(folder, write_bundle(tiny_run))
    return model.double().eval(), source, target, load_translator_parts(tiny_run)[0], folder, bundle


@pytest.fixture(scope="module")
def sentences(trained):
    """Source ids of the HSK test sentences (the units the tiny model's vocabulary knows, as translate sees)."""
    from glassformer.data.datasets import load_split

    _, source, *_ = trained
    ids = [source.analyse(p.zh).ids for p in load_split("test")]
    return [s for s in ids if s]


def lesson_ids(trained):
    model, source, target, *_ = trained
    src = source.analyse(examples.LESSON_SENTENCE).ids
    corrupt = source.analyse(examples.LESSON_CORRUPTIONS[0]).ids
    tgt_in = [model.cfg.bos_id, *target.encode(examples.LESSON_TARGET)]
    return src, corrupt, tgt_in


# ---- the bundle ---------------------------------------------------------------------------------------

def test_bundle_holds_every_weight_once_and_reads_back(trained, tiny_run):
    model, *_ = trained
    bundle = write_bundle(tiny_run)
    cfg, vocab, tensors = read_bundle(json.loads(json.dumps(bundle)))
    assert cfg == model.cfg and set(vocab) == {"source", "target"}
    state = model.state_dict()
    assert "head.weight" not in tensors and "tgt_embed.token.weight" in tensors   # tied: stored once
    for name, values in tensors.items():
        assert np.array_equal(values, state[name].numpy()), name                     # float32 is exact
    half = read_bundle(write_bundle(tiny_run, dtype="float16"))[2]
    for name, values in half.items():
        assert np.allclose(values, state[name].numpy(), rtol=1e-3, atol=1e-4), name


@pytest.mark.parametrize("damage, words", [
    (lambda b: b.update(format="other/1"), "format"),
    (lambda b: b.update(data=b["data"][:-400]), "do not fit"),
    (lambda b: b.update(data="!" + b["data"][1:]), "base64"),
    (lambda b: b["tensors"]["src_embed.token.weight"].update(shape=[10 ** 9, 10 ** 9]), "do not fit"),
    (lambda b: b.update(dtype="int8"), "dtype"),
])
def test_a_damaged_bundle_is_one_clear_line_in_python_and_in_the_engine(trained, tmp_path, damage, words):
    *_, bundle_path = trained
    bundle = json.loads(bundle_path.read_text())
    damage(bundle)
    with pytest.raises(BundleError, match=words):
        read_bundle(bundle)
    path = write(tmp_path, bundle)
    job, out = tmp_path / "job.json", tmp_path / "out.json"
    job.write_text(json.dumps({"bundle": str(path), "cases": []}))
    done = subprocess.run([NODE, str(RUNNER), str(ENGINE), str(job), str(out)], capture_output=True, text=True)
    assert done.returncode != 0
    assert "model bundle: " in done.stderr and words in done.stderr


def test_float16_is_refused_when_a_weight_is_out_of_its_range():
    model = Transformer(ModelConfig.tiny(src_vocab=10, tgt_vocab=10))
    with torch.no_grad():
        model.head.weight[3, 0] = 1e6
    with pytest.raises(UsageError, match="float16"):
        write_bundle(model, {"source": {}, "target": {}}, dtype="float16")


# ---- the forward pass, probe by probe -----------------------------------------------------------------

def test_every_probe_equals_the_pytorch_model_in_float64(trained, sentences):
    model, source, target, _, folder, bundle = trained
    src, _, tgt_in = lesson_ids(trained)
    cases = [(src, tgt_in), (sentences[0], tgt_in[:4]), (sentences[5], [model.cfg.bos_id])]
    out = run_engine(folder, bundle, [{"kind": "forward", "src": s, "tgt": t} for s, t in cases])["results"]
    for (s, t), result in zip(cases, out, strict=True):
        with torch.no_grad(), model.probes("*") as rec:
            logits = model(torch.tensor([s]), torch.tensor([t]))
        assert len(rec.names()) > 100
        name, error = worst_probe(rec, result["probes"])
        assert error < RTOL, (name, error)
        assert relative_error(logits[0], np.array(result["logits"])) < RTOL


def test_heads_switched_off_and_a_patch_equal_the_models_hooks(trained):
    model, _, _, _, folder, bundle = trained
    src, corrupt, tgt_in = lesson_ids(trained)
    heads = ["decoder.1.cross_attention.head.1", "encoder.0.self_attention.head.2", "decoder.0.self_attention.head.0"]
    patched = ["decoder.1.cross_attention.head.0.output", "encoder.0.output"]
    out = run_engine(folder, bundle, [
        {"kind": "forward", "src": src, "tgt": tgt_in, "off": heads},
        {"kind": "forward", "src": corrupt, "tgt": tgt_in, "patch": {"src": src, "names": patched}},
    ])["results"]
    with torch.no_grad(), model.probes("*") as rec, model.intervene(off(heads)):
        switched = model(torch.tensor([src]), torch.tensor([tgt_in]))
    with torch.no_grad():
        plain = model(torch.tensor([src]), torch.tensor([tgt_in]))
    assert relative_error(switched[0], np.array(out[0]["logits"])) < RTOL
    assert relative_error(plain[0], np.array(out[0]["logits"])) > 1e-6      # the switch changed something
    name, error = worst_probe(rec, out[0]["probes"])
    assert error < RTOL, (name, error)
    # recorded before the switch: the head's own output is shown, its concat columns are zeros
    concat = js_array(out[0]["probes"]["decoder.1.cross_attention.concat"])
    d_v = model.cfg.d_v
    assert not concat[:, d_v: 2 * d_v].any() and js_array(
        out[0]["probes"]["decoder.1.cross_attention.head.1.output"]).any()

    with torch.no_grad(), model.probes(*patched) as clean:
        model(torch.tensor([src]), torch.tensor([tgt_in]))
    with torch.no_grad(), model.probes("*") as rec, model.intervene({n: (lambda v, n: clean[n]) for n in patched}):
        logits = model(torch.tensor([corrupt]), torch.tensor([tgt_in]))
    assert relative_error(logits[0], np.array(out[1]["logits"])) < RTOL
    name, error = worst_probe(rec, out[1]["probes"])
    assert error < RTOL, (name, error)


def test_incremental_decoding_steps_equal_the_whole_pass(trained):
    model, _, _, _, folder, bundle = trained
    src, _, tgt_in = lesson_ids(trained)
    heads = ["decoder.1.cross_attention.head.1"]
    out = run_engine(folder, bundle, [{"kind": "steps", "src": src, "tgt": tgt_in},
                                      {"kind": "steps", "src": src, "tgt": tgt_in, "off": heads}])["results"]
    with torch.no_grad():
        whole = model(torch.tensor([src]), torch.tensor([tgt_in]))[0]
        with model.intervene(off(heads)):
            switched = model(torch.tensor([src]), torch.tensor([tgt_in]))[0]
    assert relative_error(whole, np.array(out[0]["logits"])) < RTOL
    assert relative_error(switched, np.array(out[1]["logits"])) < RTOL


@pytest.mark.parametrize("changes", [
    dict(norm_placement="pre"),
    dict(norm_placement="post", final_norm=True, positions="learned"),
    dict(positions="relative", relative_clip=3),
    dict(positions="rope", scale_scores=False),
    dict(activation="silu", bias=False, head_bias=True, tie_target=False, scale_embeddings=False),
    dict(share_embeddings=True, tgt_vocab=24, position_layout="halves", d_k=6, d_v=10),
])
def test_every_model_variant_the_config_allows(tmp_path, changes):
    """Random weights of each switch of ModelConfig the engine reads, against the PyTorch model's probes."""
    cfg = ModelConfig.tiny(**{"src_vocab": 24, "tgt_vocab": 20, **changes})
    torch.manual_seed(1)
    model = Transformer(cfg).eval()
    if cfg.head_bias:
        torch.nn.init.normal_(model.head.bias)
    model = model.double()                                                 # float32 weights: the bundle is exact
    bundle = write(tmp_path, write_bundle(model, {"source": {}, "target": {}}))
    src, tgt = [5, 6, 7, 0, 9, 10], [1, 4, 5, 6, 7]                   # a PAD inside the source
    long = [1, *(4 + i % 15 for i in range(44))]                            # past the cache's first 32 rows
    out = run_engine(tmp_path, bundle, [{"kind": "forward", "src": src, "tgt": tgt},
                                        {"kind": "steps", "src": src, "tgt": long}])["results"]
    with torch.no_grad(), model.probes("*") as rec:
        model(torch.tensor([src]), torch.tensor([tgt]))
    name, error = worst_probe(rec, out[0]["probes"])
    assert error < RTOL, (name, error)
    with torch.no_grad():
        logits = model(torch.tensor([src]), torch.tensor([long]))
    assert relative_error(logits[0], np.array(out[1]["logits"])) < RTOL


# ---- search --------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_greedy_and_beam_4_equal_the_python_search(trained, sentences):
    from glassformer.decoding.search import beam_search, greedy
    from glassformer.decoding.translator import Translator

    model, source, target, float32, folder, bundle = trained
    chosen = sentences[::2]
    out = run_engine(folder, bundle, [{"kind": "greedy", "src": s} for s in chosen]
                     + [{"kind": "beam", "src": s, "beam": 4} for s in chosen])["results"]
    js_greedy = [r["ids"] for r in out[: len(chosen)]]
    js_beam = [r["ids"] for r in out[len(chosen):]]
    py_greedy = [greedy(model, torch.tensor([s]))[0] for s in chosen]
    py_beam = [beam_search(model, torch.tensor([s]), beam=4)[0] for s in chosen]
    assert js_greedy == py_greedy
    assert js_beam == py_beam
    assert js_beam != js_greedy                                            # the beams did search
    # `glassformer translate` itself decodes in float32: the same ids but where two scores are within its rounding
    translator = Translator(float32, source, target)
    for beam, ours in ((1, js_greedy), (4, js_beam)):
        theirs = translator.translate_ids(chosen, beam=beam)
        same = sum(a == b for a, b in zip(ours, theirs, strict=True)) / len(chosen)
        assert same >= 0.95, (beam, same)


def test_search_rules_on_short_limits(trained, sentences):
    """The output limit (EOS included) and a length penalty other than 1: still the Python search's ids."""
    from glassformer.decoding.search import beam_search, greedy

    model, _, _, _, folder, bundle = trained
    chosen = sentences[:6]
    cases = ([{"kind": "greedy", "src": s, "maxLen": 3} for s in chosen]
             + [{"kind": "beam", "src": s, "beam": 3, "alpha": 0.6, "maxLen": 4} for s in chosen]
             + [{"kind": "beam", "src": s, "beam": 5, "alpha": 0.0} for s in chosen])
    out = [r["ids"] for r in run_engine(folder, bundle, cases)["results"]]
    want = ([greedy(model, torch.tensor([s]), max_len=3)[0] for s in chosen]
            + [beam_search(model, torch.tensor([s]), beam=3, alpha=0.6, max_len=4)[0] for s in chosen]
            + [beam_search(model, torch.tensor([s]), beam=5, alpha=0.0)[0] for s in chosen])
    assert out == want
    assert all(len(ids) <= 3 for ids in out[: len(chosen)])


# ---- interpretation ------------------------------------------------------------------------------------

def test_next_distribution_patching_lens_and_alti_equal_the_python_methods(trained):
    from glassformer.interpret.alti import alti_contributions
    from glassformer.interpret.lens import logit_lens
    from glassformer.interpret.patching import patch_scan

    model, _, _, _, folder, bundle = trained
    src, corrupt, tgt_in = lesson_ids(trained)
    row, token = 2, tgt_in[3]
    head = ["decoder.1.cross_attention.head.1"]
    out = run_engine(folder, bundle, [
        {"kind": "next", "src": src, "prefix": tgt_in[1:3], "top": 12},
        {"kind": "next", "src": src, "prefix": tgt_in[1:3], "off": head, "top": 12},
        {"kind": "patching", "clean": src, "corrupt": corrupt, "tgt": tgt_in, "row": row, "token": token},
        {"kind": "lens", "src": src, "tgt": tgt_in, "row": row, "token": token, "contrast": 5},
        {"kind": "alti", "src": src, "tgt": tgt_in},
    ])["results"]
    s, t = torch.tensor([src]), torch.tensor([tgt_in[:3]])
    with torch.no_grad():
        for result, fns in ((out[0], {}), (out[1], off(head))):
            with model.intervene(fns):
                p = torch.softmax(model(s, t)[0, -1], dim=-1)
            top = p.topk(12)
            assert [e["id"] for e in result["top"]] == top.indices.tolist()
            assert np.allclose([e["p"] for e in result["top"]], top.values.numpy(), rtol=RTOL, atol=0)
    assert out[0]["top"][0]["p"] != out[1]["top"][0]["p"]

    scan = patch_scan(model, s, torch.tensor([corrupt]), torch.tensor([tgt_in]), row, token)
    js = out[2]
    assert js["position_layers"] == scan["position_layers"]

    def cells(value):
        if isinstance(value, dict):
            if "p" in value:
                return [value["p"], value["fraction"]]
            return [c for k in sorted(value) for c in cells(value[k])]
        if isinstance(value, list):
            return [c for v in value for c in cells(v)]
        return [value] if isinstance(value, float) else []

    ours = cells({k: js[k] for k in ("p_clean", "p_corrupt", "heads", "all_heads", "nothing", "positions",
                                     "all_positions")})
    theirs = cells({k: scan[k].to_json() if hasattr(scan[k], "to_json") else scan[k] for k in (
        "p_clean", "p_corrupt", "all_heads", "nothing")} | {
        "heads": [[c.to_json() for c in layer] for layer in scan["heads"]],
        "positions": [[c.to_json() for c in layer] for layer in scan["positions"]],
        "all_positions": [c.to_json() for c in scan["all_positions"]]})
    assert len(ours) == len(theirs) > 20
    for a, b in zip(ours, theirs, strict=True):
        assert (a is None) == (b is None) and (a is None or abs(a - b) <= 1e-9 * max(1.0, abs(b))), (a, b)

    lens = logit_lens(model, s, torch.tensor([tgt_in]), row, token, 5)
    assert out[3]["reading"] == lens["reading"] and out[3]["row"] == row
    assert [(x["layer"], x["sublayer"], x["name"]) for x in out[3]["steps"]] == [
        (x["layer"], x["sublayer"], x["name"]) for x in lens["steps"]]
    assert np.allclose([[x["p"], x["p_contrast"]] for x in out[3]["steps"]] + [[out[3]["p_model"], 0]],
                       [[x["p"], x["p_contrast"]] for x in lens["steps"]] + [[lens["p_model"], 0]], rtol=RTOL, atol=0)

    alti = alti_contributions(model, s, torch.tensor([tgt_in]))
    assert relative_error(alti, js_array(out[4])) < RTOL
    assert np.allclose(js_array(out[4]).sum(1), 1.0)


# ---- trace spec v1: the BLOCK and the exercise ---------------------------------------------------------

def block_variants() -> list[dict]:
    """The BLOCK under every switch the lab offers (heads off, norm, scale, mask) and a decoder block."""
    from glassformer.lab.export import with_toggles

    docs = [with_toggles(examples.block_spec(), disabled, norm, scale, mask)
            for disabled, norm, scale, mask in itertools.product(((), (0,), (1,), (0, 1)), ("post", "pre"),
                                                                (True, False), ("none", "causal", "padding"))]
    docs += [with_toggles(examples.exercise_spec(), (), "post", scale, mask)
             for scale, mask in itertools.product((True, False), ("none", "causal", "padding"))]
    rng = np.random.default_rng(0)
    m = lambda *shape: rng.normal(size=shape).round(3).tolist()
    head = lambda: {"w_q": m(4, 3), "w_k": m(4, 3), "w_v": m(4, 2), "b_q": m(3), "b_k": m(3), "b_v": m(2)}
    docs.append({"version": 1, "kind": "decoder_block", "x": m(3, 4), "memory": m(5, 4), "norm": "pre",
                 "self_attention": {"heads": [head(), head()], "w_o": m(4, 4), "b_o": m(4)},
                 "cross_attention": {"heads": [head(), head()], "w_o": m(4, 4)},
                 "ffn": {"w_1": m(4, 6), "b_1": m(6), "w_2": m(6, 4)}, "mask": "causal",
                 "memory_padding": [False, False, False, True, True], "disabled_heads": [1],
                 "layer_norms": [{"gamma": m(4), "beta": m(4)} for _ in range(3)], "eps": 1e-3})
    return docs


def test_trace_blocks_equal_the_reference_and_the_lessons_numbers(tmp_path):
    docs = block_variants()
    out = run_engine(tmp_path, None, [{"kind": "trace", "doc": d} for d in docs])["results"]
    for doc, result in zip(docs, out, strict=True):
        assert max_difference(result, run_reference(doc)) < 1e-12, doc.get("kind")
    block = out[0]                                                         # no switch: the lesson's BLOCK
    tol = examples.LESSON_DECIMALS_TOLERANCE
    row = examples.BLOCK_ROW1
    assert np.allclose(block["output"][0], row["ln2"], atol=tol, rtol=0)
    assert np.allclose(block["self_attention"]["heads"][0]["output"][0], row["head1"], atol=tol, rtol=0)
    assert np.allclose(block["self_attention"]["heads"][1]["output"][0], row["head2"], atol=tol, rtol=0)
    assert np.allclose(block["sublayers"][0]["normed"][0], row["ln1"], atol=tol, rtol=0)
    assert np.allclose(block["ffn"]["hidden"][0], row["ffn_hidden"], atol=tol, rtol=0)
    exercise = run_engine(tmp_path, None, [{"kind": "trace", "doc": examples.exercise_spec()}])["results"][0]
    assert np.allclose(exercise["weights"], examples.EXERCISE_WEIGHTS, atol=tol, rtol=0)
    assert np.allclose(exercise["output"], examples.EXERCISE_OUTPUT, atol=tol, rtol=0)


def test_a_bad_trace_document_names_its_field(tmp_path):
    bad = examples.block_spec()
    bad["self_attention"]["w_o"] = [[1.0, 0.0]]
    errors = run_engine(tmp_path, None, [
        {"kind": "error", "case": {"kind": "trace", "doc": bad}},
        {"kind": "error", "case": {"kind": "trace", "doc": {**examples.block_spec(), "disabled_heads": [5]}}},
        {"kind": "error", "case": {"kind": "trace", "doc": {**examples.exercise_spec(), "version": 2}}},
        *({"kind": "error", "case": {"kind": "trace", "doc": doc}} for doc in _bad_biases()),
    ])["results"]
    assert errors[0]["error"].startswith("self_attention.w_o: expected 4×4")
    assert errors[1]["error"].startswith("disabled_heads[0]: head 5 out of range")
    assert errors[2]["error"].startswith("version:")
    assert [e["error"].split(":")[0] for e in errors[3:]] == [field for field, _ in BAD_BIASES]   # once unread


BAD_BIASES = [("ffn.b_1", ["x"] * 4), ("ffn.b_2", [0.0] * 3), ("self_attention.b_o", [None] * 4),
              ("self_attention.heads[1].b_v", [0.0]), ("self_attention.heads[0].b_q", [1.0, "1"])]


def _bad_biases() -> list[dict]:
    docs = []
    for field, value in BAD_BIASES:
        doc, *path, key = [examples.block_spec(), *field.replace("[", ".").replace("]", "").split(".")]
        node = doc
        for part in path:
            node = node[int(part)] if part.isdigit() else node[part]
        node[key] = value
        docs.append(doc)
    return docs


def test_a_number_beyond_the_magnitude_bound_is_refused_as_python_refuses_it(tmp_path):
    """MAX_SPEC_MAGNITUDE in the page: the same field and the same line as lesson/spec_schema.py's LimitError."""
    docs = []
    for path, value in (("x", 1e300), ("self_attention.w_o", -1.000001e12), ("ffn.b_2", 3e15)):
        doc = examples.block_spec()
        if path == "ffn.b_2":
            doc["ffn"]["b_2"] = [0.0, value, 0.0, 0.0]
        elif path == "x":
            doc["x"][2][1] = value
        else:
            doc["self_attention"]["w_o"][1][3] = value
        docs.append(doc)
    at_the_bound = examples.block_spec()
    at_the_bound["x"][0][0] = -1e12
    out = run_engine(tmp_path, None, [{"kind": "error", "case": {"kind": "trace", "doc": d}} for d in docs] +
                     [{"kind": "trace", "doc": at_the_bound}])["results"]
    for doc, result in zip(docs, out[:3], strict=True):
        with pytest.raises(LimitError) as info:
            validate_spec(doc)
        assert result["error"] == str(info.value)
    assert [r["error"] for r in out[:3]] == ["x[2][1]: 1e+300 is beyond ±1e+12 (MAX_SPEC_MAGNITUDE)",
                                             "self_attention.w_o[1][3]: -1.000001e+12 is beyond ±1e+12 "
                                             "(MAX_SPEC_MAGNITUDE)",
                                             "ffn.b_2[1]: 3e+15 is beyond ±1e+12 (MAX_SPEC_MAGNITUDE)"]
    assert max_difference(out[3], run_reference(at_the_bound)) < 1e-9


# ---- planted bugs turn the comparisons red -------------------------------------------------------------

PLANTS = {
    "scale after the softmax": [
        ("model.js", "let s = scale ? scores.data[i] / root : scores.data[i];", "let s = scores.data[i];"),
        ("model.js", "let weights = softmaxOverKeys(scaled, visible, tape);",
         "let weights = softmaxOverKeys(scaled, visible, tape);\n"
         "  if (scale) for (let i = 0; i < weights.data.length; i++) weights.data[i] /= root;"),
        ("trace.js", "(visible && !visible[i][j] ? -Infinity : scale ? s / root : s)));",
         "(visible && !visible[i][j] ? -Infinity : s)));\n"
         "  const unscaled = softmaxRows(scaled, visible);\n"
         "  const weights = unscaled.map((row) => row.map((w) => (scale ? w / root : w)));"),
        ("trace.js", "  const weights = softmaxRows(scaled, visible);\n", ""),
    ],
    "a causal mask off by one": [
        ("model.js", "mask.data[i * nKey + j] = j <= offset + i ? 1 : 0;",
         "mask.data[i * nKey + j] = j <= offset + i + 1 ? 1 : 0;"),
        ("trace.js", "Array.from({ length: m }, (_, j) => j <= i)", "Array.from({ length: m }, (_, j) => j < i)"),
    ],
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_planted_bug_turns_the_parity_checks_red(trained, tmp_path, plant):
    model, _, _, _, folder, bundle = trained
    engine = tmp_path / "engine"
    shutil.copytree(ENGINE, engine)
    for file, old, new in PLANTS[plant]:
        text = (engine / file).read_text()
        assert text.count(old) == 1, (file, old)                           # the code the bug goes into is there
        (engine / file).write_text(text.replace(old, new))
    src, _, tgt_in = lesson_ids(trained)
    docs = [examples.block_spec(), {**examples.block_spec(), "mask": "causal"}]
    out = run_engine(tmp_path, bundle, [{"kind": "forward", "src": src, "tgt": tgt_in}]
                     + [{"kind": "trace", "doc": d} for d in docs], engine=engine)["results"]
    with torch.no_grad(), model.probes("*") as rec:
        logits = model(torch.tensor([src]), torch.tensor([tgt_in]))
    assert relative_error(logits[0], np.array(out[0]["logits"])) > 1e-4
    assert worst_probe(rec, out[0]["probes"])[1] > 1e-4
    assert max(max_difference(r, run_reference(d)) for r, d in zip(out[1:], docs, strict=True)) > 1e-3


# ---- the engine's own tests and one-file rules ---------------------------------------------------------

def test_engine_files_can_be_inlined_into_one_script():
    """Single-line relative imports at the top, `export` declarations only (index.js re-exports), and no
    top-level name twice across the files: the exporter strips imports and `export ` and concatenates."""
    names: dict[str, str] = {}
    for path in sorted(ENGINE.glob("*.js")):
        text = path.read_text(encoding="utf-8")
        assert "export default" not in text, path.name
        for line in text.splitlines():
            if line.startswith("import "):
                assert line.rstrip().endswith('.js";') and " from \"./" in line, (path.name, line)
            if path.name != "index.js":
                assert not line.startswith("export {") and not line.startswith("export *"), (path.name, line)
        if path.name == "index.js":
            continue
        for line in text.splitlines():
            if line[:1].isspace():
                continue                                                   # inside a block: not top-level
            words = line.replace("export ", "", 1).split()
            if len(words) > 1 and words[0] in ("function", "function*", "const", "let", "var", "class"):
                name = words[1].split("(")[0].rstrip("=;")
                assert name not in names, f"{name} in {path.name} and {names[name]}"
                names[name] = path.name


def test_node_own_engine_tests(trained, tmp_path):
    """`node --test tests/engine/`: the pure-JS tests, with this run's bundle as their fixture."""
    *_, bundle = trained
    env = {**os.environ, "GLASSFORMER_ENGINE_BUNDLE": str(bundle)}
    done = subprocess.run([NODE, "--test", str(Path(__file__).parent / "engine")], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "# fail 0" in done.stdout


# ---- speed of the default model's shape ----------------------------------------------------------------

@pytest.mark.slow
def test_speed_of_a_default_sized_model(tmp_path):
    """d 128, 2+2 layers, 4 heads, d_ff 512, 4000 target tokens (random weights, EOS never chosen): a 12-step
    greedy translation and a full patching table, timed and printed (the page's budgets are measured, not
    asserted: a loaded machine must not turn a test red), and the greedy run decodes all 12 steps."""
    cfg = ModelConfig(src_vocab=3000, tgt_vocab=4000, d_model=128, heads=4, d_ff=512, encoder_layers=2,
                      decoder_layers=2, head_bias=True, max_len=256)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        model.head.bias[cfg.eos_id] = -1e4
    bundle = write(tmp_path, write_bundle(model, {"source": {}, "target": {}}))
    src = list(range(10, 20))
    greedy_case = {"kind": "greedy", "src": src, "maxLen": 12}
    table = {"kind": "patching", "clean": src, "corrupt": [11, *src[1:]], "tgt": [1, 5, 6, 7, 8], "row": 2,
             "token": 9}
    out = run_engine(tmp_path, bundle, [{"kind": "time", "case": greedy_case},
                                        {"kind": "time", "case": {"kind": "beam", "src": src, "beam": 4, "maxLen": 12}},
                                        {"kind": "time", "case": table, "repeat": 2}])
    greedy_ms, beam_ms, table_ms = (r["ms"] for r in out["results"])
    print(f"\nengine, default shape: load {out['load_ms']:.0f} ms, greedy 12 steps {greedy_ms:.0f} ms, "
          f"beam 4 {beam_ms:.0f} ms, patching table {table_ms:.0f} ms")
    assert len(out["results"][0]["result"]["ids"]) == 12


def test_the_pages_limits_are_glassformer_limits():
    """The page checks a trace spec and an attribution as the CLI and the server do: the same numbers."""
    script = (f"const t = await import('{(ENGINE / 'trace.js').as_uri()}'); "
              f"const a = await import('{(ENGINE / 'attribute.js').as_uri()}'); "
              "console.log(JSON.stringify({trace: t.TRACE_LIMITS, attribution: a.ATTRIBUTION_LIMITS}));")
    page = json.loads(subprocess.run([NODE, "--input-type=module", "-e", script], capture_output=True, text=True,
                                     check=True, timeout=60).stdout)
    from glassformer import limits
    assert page["trace"] == {"rows": limits.MAX_SPEC_ROWS, "width": limits.MAX_SPEC_WIDTH,
                             "heads": limits.MAX_SPEC_HEADS, "elements": limits.MAX_MATRIX_ELEMENTS,
                             "magnitude": limits.MAX_SPEC_MAGNITUDE}
    assert page["attribution"] == {name: getattr(limits, name) for name in page["attribution"]}
    assert set(page["attribution"]) == {"MAX_IG_STEPS", "MAX_ATTRIBUTION_PASSES", "MAX_ATTRIBUTION_POSITIONS",
                                        "MAX_IG_AUTO_STEPS"}
