"""The page engine's attribution (lab/static/engine/attribute.js) against the Python methods behind
`glassformer attribute --json` (interpret/why.py) and attribution patching (interpret/attribution_patching.py).

The trained tiny model runs in float64 on both sides (the bundle's float32 weights, `model.double()`), on HSK test
sentences (not the lesson's defaults): saliency, input x gradient, integrated gradients at fixed steps (trapezoid and
Gauss-Legendre) and at steps "auto" (its doubling, its completeness errors, its passes), with and without a contrast
word, the attention and ALTI+ rows, a greedy target; every number of the CLI's JSON must agree to 1e-9 of the
report's largest score, every string, count and list exactly.
"""

from __future__ import annotations

import math

import pytest
import torch

from glassformer.interpret.attribution_patching import approximate_scan
from glassformer.interpret.patching import _plain
from glassformer.interpret.why import why
from test_engine import NODE, run_engine, trained  # noqa: F401  (trained: the module fixture of the tiny run)

pytestmark = pytest.mark.skipif(NODE is None, reason="needs Node.js (node) on PATH")
TOL = 1e-9


def numbers(value) -> list[float]:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return []
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, dict):
        return [x for k in sorted(value) for x in numbers(value[k])]
    return [x for v in value for x in numbers(v)]


def assert_same(ours, theirs, scale: float, where: str = "") -> None:
    """Equal structure, strings, ints and None; floats within TOL x scale."""
    if isinstance(theirs, float) and not isinstance(ours, bool) and isinstance(ours, int | float):
        assert abs(ours - theirs) <= TOL * scale, (where, ours, theirs)
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs), (where, list(ours), list(theirs))
        for key in theirs:
            assert_same(ours[key], theirs[key], scale, f"{where}.{key}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), (where, ours, theirs)
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, scale, f"{where}[{i}]")
    else:
        assert ours == theirs and type(ours) is type(theirs), (where, ours, theirs)


@pytest.fixture(scope="module")
def chosen(trained):  # noqa: F811
    """Three HSK test pairs of 4-9 source units whose English is 3-8 pieces, and a one-token contrast word."""
    from glassformer.data.datasets import load_split

    model, source, target, *_ = trained
    pairs = []
    for p in load_split("test"):
        enc = source.analyse(p.zh)
        if not enc.unknown and 4 <= len(enc.ids) <= 9 and 3 <= len(target.encode(p.en)) <= 8:
            pairs.append((p.zh, p.en))
    contrast = next(w for w in ("her", "she", "it", "you", "the") if len(target.tokens(w)) == 1)
    return pairs[1:4], contrast


def engine_case(trained, sentence, target_text, contrast, **opts):  # noqa: F811
    """The runner's "attribute" case for one sentence (its ids and pieces from the Python tokenizers)."""
    model, source, target, *_ = trained
    from glassformer.interpret.attribution import special_ids
    from glassformer.interpret.why import _piece

    enc = source.analyse(sentence)
    out = None if target_text is None else target.encode(target_text)
    case = {"kind": "attribute", "src": enc.ids, "units": enc.units, "out": out, "opts": opts,
            "contrast": contrast, "contrastToken": target.token_to_id(target.tokens(contrast)[0]) if contrast else None}
    if out is not None:
        case["pieces"] = [_piece(target, special_ids(model), t) for t in [*out, model.cfg.eos_id]]
    return case


METHODS = [
    dict(method="saliency"),
    dict(method="input-x-gradient"),
    dict(method="integrated-gradients", steps=8),
    dict(method="integrated-gradients", steps=6, rule="gauss-legendre"),
    dict(method="integrated-gradients", steps="auto", tolerance=0.003),
    dict(method="attention"),
    dict(method="alti"),
]


def test_every_method_equals_the_cli_json(trained, chosen):  # noqa: F811
    model, source, target, *_, folder, bundle = trained
    pairs, contrast = chosen
    jobs = []
    for k, opts in enumerate(METHODS):
        zh, en = pairs[k % len(pairs)]
        gradient = opts["method"] not in ("attention", "alti")
        word = contrast if gradient and k % 2 == 0 else None
        jobs.append((zh, en if k != 0 else None, word, opts))            # saliency: the greedy target, fed back
    cases = [engine_case(trained, zh, en, word, **opts) for zh, en, word, opts in jobs]
    out = run_engine(folder, bundle, cases)["results"]
    for (zh, en, word, opts), result in zip(jobs, out, strict=True):
        full = why(model, source, target, zh, en, contrast=word, lens=False, **opts)
        theirs = {k: full[k] for k in ("method", "contrast", "integration", "rows")}
        scale = max(abs(x) for x in numbers(theirs["rows"]) if math.isfinite(x))
        assert_same(result["report"], theirs, scale, opts["method"])
        assert result["target"]["mode"] == full["details"]["mode"]
        assert result["target"]["finished"] == full["details"]["finished"]
    auto = out[4]["report"]
    assert auto["integration"]["steps"] == "auto" and len(auto["rows"]) >= 2
    assert all(r["error"] <= 0.003 or r["token"] in auto["integration"]["unconverged"] for r in auto["rows"])
    assert any(r["steps"] > 16 for r in auto["rows"])                     # the doubling ran
    assert out[0]["report"]["contrast"] == contrast and out[0]["report"]["rows"][0]["source_share"] is not None


def test_attribution_patching_equals_the_python_estimate(trained, chosen):  # noqa: F811
    model, source, target, *_, folder, bundle = trained
    (zh, en), *_ = chosen[0]
    clean = source.analyse(zh).ids
    corrupt = [clean[1], clean[0], *clean[2:]]                             # two units swapped
    tgt_in = [model.cfg.bos_id, *target.encode(en)]
    row, token = 1, tgt_in[2]
    out = run_engine(folder, bundle, [
        {"kind": "attribution_patching", "clean": clean, "corrupt": corrupt, "tgt": tgt_in, "row": row, "token": token},
        {"kind": "attribution_patching", "clean": clean, "corrupt": corrupt[:-1], "tgt": tgt_in, "row": row,
         "token": token, "positions": False},
    ])["results"]
    for result, positions, ids in ((out[0], True, corrupt), (out[1], False, corrupt[:-1])):
        with torch.enable_grad():
            scan = approximate_scan(model, torch.tensor([clean]), torch.tensor([ids]), torch.tensor([tgt_in]), row,
                                    token, positions=positions)
        plain = _plain(scan)
        assert_same(result, plain, 1.0, "scan")
    assert out[0]["p_clean"] != out[0]["p_corrupt"] and len(out[0]["positions"]) == model.cfg.encoder_layers + 1


PLANTS = {
    "the trapezoid's doubled grid keeps the earlier sum whole": ("const keep = nested ? 0.5 : 0.0;",
                                                                 "const keep = nested ? 1.0 : 0.0;"),
    "a sinusoidal model integrates from the PAD embedding": (
        'return model.config.positions === "sinusoidal" ? "position-only" : "pad-token";', 'return "pad-token";'),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_planted_bug_turns_the_attribution_check_red(trained, chosen, tmp_path, plant):  # noqa: F811
    import shutil

    from test_engine import ENGINE

    model, source, target, *_, folder, bundle = trained
    (zh, en), *_ = chosen[0]
    engine = tmp_path / "engine"
    shutil.copytree(ENGINE, engine)
    old, new = PLANTS[plant]
    text = (engine / "attribute.js").read_text()
    assert text.count(old) == 1, old
    (engine / "attribute.js").write_text(text.replace(old, new))
    opts = dict(method="integrated-gradients", steps="auto", tolerance=0.003)
    ours = run_engine(tmp_path, bundle, [engine_case(trained, zh, en, None, **opts)], engine=engine)["results"][0]
    theirs = why(model, source, target, zh, en, lens=False, **opts)
    worst = max(abs(a - b) for a, b in zip(numbers(ours["report"]["rows"]), numbers(theirs["rows"]), strict=True))
    assert worst > 1e-3
