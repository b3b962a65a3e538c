"""The lab's exercises in JavaScript (lab/static/engine/exercises.js) against the Python library.

Node runs tests/engine/exercises_cases.mjs. For the same seed and options the page must draw the same sheet
as `glassformer exercise new` (same numbers, same draw count of the audit, same covered bugs), its key must
agree with the float64 reference at 1e-12, and on answers planted by the loop implementation of
tests/test_exercises.py (each bug of the library, a right hand-in, a slip with cells computed from it) it must
name the planted bug and give the same verdict per cell as `exercise check`.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import glassformer
from glassformer.lesson.exercises.bugs import BUGS, not_covered, run
from glassformer.lesson.exercises.check import check, parse_answers
from glassformer.lesson.exercises.generate import key_text, new_sheet
from test_exercises import answers, plant

ENGINE = Path(glassformer.__file__).parent / "lab" / "static" / "engine"
RUNNER = Path(__file__).parent / "engine" / "exercises_cases.mjs"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="needs Node.js (node) on PATH")

# (kind, options, seed): both kinds, post and pre norm, causal and no mask, a seed whose first draw fails the audit
SHEETS = [("attention", {}, 0), ("attention", {}, 3), ("attention", {}, 8), ("attention", {"mask": "none"}, 4),
          ("attention", {"mask": "none"}, 8), ("block", {}, 0), ("block", {}, 7), ("block", {"norm": "pre"}, 5),
          ("block", {"mask": "causal"}, 9), ("block", {"norm": "pre", "mask": "causal"}, 12),
          ("attention", {"decimals": 2}, 21)]


def run_js(tmp: Path, cases: list[dict], engine: Path = ENGINE) -> list[dict]:
    job, out = tmp / "job.json", tmp / "out.json"
    job.write_text(json.dumps({"cases": cases}))
    done = subprocess.run([NODE, str(RUNNER), str(engine), str(job), str(out)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())["results"]


def case(op: str, kind: str, kw: dict, seed: int, **more) -> dict:
    return {"op": op, "kind": kind, "seed": seed, **kw, **more}


def table(rows) -> np.ndarray:
    return np.array([[-math.inf if v is None else v for v in r] for r in rows], dtype=float)


def python_report(sheet, doc) -> dict:
    return check(sheet, parse_answers(json.loads(json.dumps(doc)), sheet, "answers.json")).as_json()


def planted(sheet) -> list[str]:
    bugs = [b.id for b in BUGS if not_covered(b, sheet) is None]
    return bugs + (["causal-off-by-one+"] if sheet.mask == "causal" else [])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every JS case of this file in one Node run: the sheets, then a hand-in per planted bug of each sheet."""
    tmp = tmp_path_factory.mktemp("exercises-js")
    sheets = [new_sheet(kind, seed, **kw) for kind, kw, seed in SHEETS]
    cases, index = [], {}
    for (kind, kw, seed), sheet in zip(SHEETS, sheets, strict=True):
        index[("sheet", kind, seed, str(kw))] = len(cases)
        cases.append(case("sheet", kind, kw, seed))
        for bug in [None, *planted(sheet)]:
            index[("check", kind, seed, str(kw), bug)] = len(cases)
            cases.append(case("check", kind, kw, seed, answers=answers(plant(sheet, bug), sheet.asked)))
    results = run_js(tmp, cases)
    return sheets, results, index, tmp


@pytest.mark.parametrize("n", range(len(SHEETS)), ids=[f"{k}-{'-'.join(map(str, kw.values()))}-{s}"
                                                       for k, kw, s in SHEETS])
def test_the_page_draws_the_same_sheet_and_key_as_python(runs, n):
    sheets, results, index, _ = runs
    kind, kw, seed = SHEETS[n]
    sheet, js = sheets[n], results[index[("sheet", kind, seed, str(kw))]]
    assert "error" not in js, js
    assert js["doc"] == json.loads(json.dumps(sheet.doc))
    assert js["asked"] == sheet.asked
    audit = {k: js["audit"][k] for k in ("covered", "not_covered", "draws")}
    assert audit == {k: sheet.audit[k] for k in ("covered", "not_covered", "draws")}
    assert js["audit"]["margin"] == pytest.approx(sheet.audit["margin"], rel=1e-15)
    # the key: against the library's computation and against the reference (key.json)
    python = run(sheet)
    assert set(js["key"]) == set(python)
    for path, value in js["key"].items():
        a, b = table(value), python[path]
        assert np.array_equal(np.isinf(a), np.isinf(b)), path
        with np.errstate(invalid="ignore"):
            assert np.max(np.abs(np.where(np.isfinite(a), a - b, 0.0)), initial=0.0) < 1e-12, path
    reference = json.loads(key_text(sheet.doc))
    for path in sheet.asked:
        node = reference
        for part in path.split("."):
            node = node[int(part)] if isinstance(node, list) else node[part]
        a, b = table(js["key"][path]), table(node)
        assert np.array_equal(np.isinf(a), np.isinf(b)) and np.allclose(a[np.isfinite(a)], b[np.isfinite(b)],
                                                                         rtol=0, atol=1e-12), path


@pytest.mark.parametrize("n", range(len(SHEETS)), ids=[f"{k}-{'-'.join(map(str, kw.values()))}-{s}"
                                                       for k, kw, s in SHEETS])
def test_the_page_names_every_planted_bug_as_python_does(runs, n):
    sheets, results, index, _ = runs
    kind, kw, seed = SHEETS[n]
    sheet = sheets[n]
    right = results[index[("check", kind, seed, str(kw), None)]]
    assert right["verdict"] == "right" and right["bugs"] == [], right
    assert [c["path"] for c in right["cells"]] == sheet.asked
    assert len(planted(sheet)) >= (13 if sheet.kind == "block" else 6 if sheet.mask == "causal" else 4)
    for bug in planted(sheet):
        js = results[index[("check", kind, seed, str(kw), bug)]]
        assert js["bugs"] == [bug.rstrip("+")], (bug, js)
        assert js["verdict"] == "wrong"
        assert all(c["verdict"] in ("right", "carried") or c["bug"] == bug.rstrip("+") for c in js["cells"])
        py = python_report(sheet, answers(plant(sheet, bug), sheet.asked))
        assert [(c["path"], c["verdict"], c["bug"]) for c in js["cells"]] == \
               [(c["path"], c["verdict"], c["bug"]) for c in py["cells"]], bug


def test_a_slip_is_wrong_where_it_is_and_carried_after_it(tmp_path):
    sheet = new_sheet("attention", 4, mask="none")
    d = sheet.doc
    scores = [[sum(a * b for a, b in zip(qi, kj, strict=True)) for kj in d["k"]] for qi in d["q"]]
    scores[1][2] += 1.0
    block = new_sheet("block", 2)
    attention_doc = answers(plant(sheet, scores=scores), sheet.asked)
    block_doc = answers(plant(block, slip=(1, 0, 2, 2.0)), block.asked)
    js, js_block = run_js(tmp_path, [case("check", "attention", {"mask": "none"}, 4, answers=attention_doc),
                                     case("check", "block", {}, 2, answers=block_doc)])
    got = {c["path"]: (c["verdict"], c["bug"]) for c in js["cells"]}
    assert got == {"scores": ("wrong", "slip"), "scaled_scores": ("carried", None),
                   "weights": ("carried", None), "output": ("carried", None)}
    assert js["bugs"] == [] and js["verdict"] == "wrong" and js["cells"][0]["off"] == [[1, 2]]
    got = {c["path"]: (c["verdict"], c["bug"]) for c in js_block["cells"]}
    assert got["self_attention.heads.1.scores"] == ("wrong", "slip")
    assert got["self_attention.heads.1.scaled_scores"] == ("carried", None)
    assert sum(v[0] == "wrong" for v in got.values()) == 1 and js_block["bugs"] == []
    py = python_report(block, block_doc)
    assert [(c["path"], c["verdict"], c["bug"]) for c in js_block["cells"]] == \
           [(c["path"], c["verdict"], c["bug"]) for c in py["cells"]]


def test_a_subset_of_cells_and_bad_answers(tmp_path):
    sheet = new_sheet("block", 0)
    full = answers(plant(sheet, "softmax-over-queries"), sheet.asked)
    only = {"self_attention": {"heads": [{}, {"weights": full["self_attention"]["heads"][1]["weights"]}]}}
    bad = [{"scores": [[1, 2, 3], [4, 5, 6]]},                     # 2 rows, the table has 3
           {"scores": [[1, 2, 3], [4, "NaN", 6], [7, 8, 9]]},
           {"scores": [[1, 2, 3], [4, 5, 6], [7, 8]]},
           {"weights": "high"},
           {"attention": [[1]]},
           []]
    results = run_js(tmp_path, [case("check", "block", {}, 0, answers=only)]
                     + [case("check", "attention", {}, 0, answers=doc) for doc in bad])
    assert [(c["path"], c["verdict"], c["bug"]) for c in results[0]["cells"]] == [
        ("self_attention.heads.1.weights", "wrong", "softmax-over-queries")]
    errors = [r.get("error") for r in results[1:]]
    assert all(e and "\n" not in e for e in errors), errors
    for error, where in zip(errors, ["scores", "scores[1][1]", "scores[2]", "weights", "attention", "answers"],
                            strict=True):
        assert error.startswith(where), (where, error)


def test_the_audit_rejects_two_bugs_that_coincide(tmp_path):
    """Asking only the scaled scores: no-scale and scale-after-softmax both leave S unscaled (as in Python)."""
    (js,) = run_js(tmp_path, [case("audit", "attention", {}, 0, ask=["scaled_scores"])])
    assert any("no-scale and scale-after-softmax" in p for p in js["problems"]), js
    (js,) = run_js(tmp_path, [case("sheet", "attention", {}, 0, asked=["scaled_scores"])])
    assert "passes the audit" in js["error"]


def test_a_planted_bug_in_the_page_turns_the_comparison_red(tmp_path):
    """A copy of the page's code with LayerNorm's variance over d − 1: its keys no longer match Python's."""
    engine = tmp_path / "engine"
    shutil.copytree(ENGINE, engine)
    path = engine / "exercises.js"
    text = path.read_text(encoding="utf-8")
    planted_text = text.replace("Math.max(g.length - sw.lnDdof, 1)", "Math.max(g.length - 1 - sw.lnDdof, 1)")
    assert planted_text != text
    path.write_text(planted_text, encoding="utf-8")
    sheet = new_sheet("block", 7)
    (js,) = run_js(tmp_path, [case("sheet", "block", {}, 7)], engine)
    worst = max(float(np.max(np.abs(table(js["key"][p]) - run(sheet)[p]))) if "error" not in js else math.inf
                for p in sheet.asked)
    assert worst > 1e-3


def test_an_empty_hand_in_is_empty_in_the_page_as_in_python(tmp_path):
    """No cell filled never passes: the page says "empty", as `exercise check` does (not "right")."""
    sheet = new_sheet("attention", 0)
    (js,) = run_js(tmp_path, [case("check", "attention", {}, 0, answers={})])
    assert js["verdict"] == "empty" and js["cells"] == [] and js["bugs"] == []
    assert python_report(sheet, {})["verdict"] == "empty"
