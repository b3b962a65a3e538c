"""Exercises: sheets, their audit, the checker's verdicts and named bugs, the files a teacher hands out.

The planted answers come from a second implementation written here (loops over rows and keys, its own
bug flags), not from the library's switches, so a checker that named the wrong bug, or called a carried
mistake wrong, would fail.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from glassformer.cli import main
from glassformer.errors import UsageError
from glassformer.lesson.exercises.bugs import BUGS, not_covered
from glassformer.lesson.exercises.check import check, parse_answers
from glassformer.lesson.exercises.generate import audit, new_sheet
from glassformer.lesson.exercises.render import moodle_xml, worksheet_html, worksheet_md
from glassformer.lesson.reference import max_difference, run_reference

# ---- a second implementation, with bugs planted --------------------------------------------------


def _softmax_row(values, seen):
    idx = [j for j, s in enumerate(seen) if s]
    out = [0.0] * len(values)
    if idx:
        top = max(values[j] for j in idx)
        total = sum(math.exp(values[j] - top) for j in idx)
        for j in idx:
            out[j] = math.exp(values[j] - top) / total
    return out


def plant_attention(q, k, v, mask, bug=None, d_model=None, scores=None):
    """One head, loop by loop; `bug` a library id; `scores` replaces QKᵀ (a slip carried onwards)."""
    n, m, d_k = len(q), len(k), len(q[0])
    if scores is None:
        if bug == "transposed-scores":
            scores = [[sum(k[i][t] * q[j][t] for t in range(d_k)) for j in range(m)] for i in range(n)]
        else:
            scores = [[sum(q[i][t] * k[j][t] for t in range(d_k)) for j in range(m)] for i in range(n)]
    shift = {"causal-off-by-one": -1, "causal-off-by-one+": 1}.get(bug, 0)
    seen = [[(j <= i + shift) if mask == "causal" else True for j in range(m)] for i in range(n)]
    div = {"no-scale": 1.0, "scale-after-softmax": 1.0,
           "scale-by-d-model": math.sqrt(d_model or d_k)}.get(bug, math.sqrt(d_k))
    scaled = [[scores[i][j] / div for j in range(m)] for i in range(n)]
    if bug == "mask-after-softmax":
        weights = [_softmax_row(scaled[i], [True] * m) for i in range(n)]
        weights = [[w if seen[i][j] else 0.0 for j, w in enumerate(weights[i])] for i in range(n)]
    elif bug == "softmax-over-queries":
        cols = [_softmax_row([scaled[i][j] for i in range(n)], [seen[i][j] for i in range(n)]) for j in range(m)]
        weights = [[cols[j][i] for j in range(m)] for i in range(n)]
    else:
        weights = [_softmax_row(scaled[i], seen[i]) for i in range(n)]
    if bug == "scale-after-softmax":
        weights = [[w / math.sqrt(d_k) for w in row] for row in weights]
    shown = [[scaled[i][j] if (seen[i][j] or bug == "mask-after-softmax") else None for j in range(m)]
             for i in range(n)]
    output = [[sum(weights[i][j] * v[j][t] for j in range(m)) for t in range(len(v[0]))] for i in range(n)]
    return {"scores": scores, "scaled_scores": shown, "weights": weights, "output": output}


def _matmul(a, b):
    return [[sum(a[i][t] * b[t][j] for t in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]


def _ln(x, eps, bug):
    d = len(x[0])
    if bug == "ln-across-positions":
        flat = [v for row in x for v in row]
        mu = sum(flat) / len(flat)
        var = sum((v - mu) ** 2 for v in flat) / len(flat)
        return [[(v - mu) / math.sqrt(var + eps) for v in row] for row in x]
    out = []
    for row in x:
        mu = sum(row) / d
        ss = sum((v - mu) ** 2 for v in row)
        var = ss / (d - 1) if bug == "ln-unbiased-variance" else ss / d
        den = math.sqrt(var) + eps if bug == "ln-eps-outside-sqrt" else math.sqrt(var + eps)
        out.append([(v - mu) / den for v in row])
    return out


def plant_block(doc, bug=None, slip=None):
    """The encoder block of a sheet, sub-layer by sub-layer; `slip` = (head, row, col, delta) on a score."""
    x, eps, att = doc["x"], doc["eps"], doc["self_attention"]
    norm = doc.get("norm", "post")
    norm = {"pre-norm-instead-of-post": "pre", "post-norm-instead-of-pre": "post"}.get(bug, norm)
    d = len(x[0])
    a_in = _ln(x, eps, bug) if norm == "pre" else x
    heads = []
    for r, h in enumerate(att["heads"]):
        q, k, v = _matmul(a_in, h["w_q"]), _matmul(a_in, h["w_k"]), _matmul(a_in, h["w_v"])
        scores = None
        if slip and slip[0] == r:
            scores = [[sum(q[i][t] * k[j][t] for t in range(len(q[0]))) for j in range(len(k))]
                      for i in range(len(q))]
            scores[slip[1]][slip[2]] += slip[3]
        head = plant_attention(q, k, v, doc.get("mask", "none"), bug, d, scores)
        heads.append({"q": q, "k": k, "v": v, **head})
    order = heads[::-1] if bug == "heads-concat-reversed" else heads
    concat = [sum((h["output"][i] for h in order), []) for i in range(len(x))]
    mha = concat if bug == "no-output-projection" else _matmul(concat, att["w_o"])

    def add(a, b):
        return [row[:] for row in b] if bug == "no-residual" else [[p + s for p, s in zip(ra, rb, strict=True)]
                                                                  for ra, rb in zip(a, b, strict=True)]

    res0 = add(x, mha)
    if norm == "post":
        u = _ln(res0, eps, bug)
        ffn_in, normed0 = u, u
    else:
        u, normed0 = res0, a_in
        ffn_in = _ln(res0, eps, bug)
    pre_act = _matmul(ffn_in, doc["ffn"]["w_1"])
    hidden = pre_act if bug == "ffn-without-relu" else [[max(v, 0.0) for v in row] for row in pre_act]
    ffn = _matmul(hidden, doc["ffn"]["w_2"])
    res1 = add(u, ffn)
    out = _ln(res1, eps, bug) if norm == "post" else res1
    return {"self_attention": {"heads": heads, "concat": concat, "output": mha},
            "ffn": {"hidden": hidden, "output": ffn},
            "sublayers": [{"input": x, "residual": res0, "normed": normed0},
                          {"input": u, "residual": res1, "normed": out if norm == "post" else ffn_in}],
            "output": out}


def plant(sheet, bug=None, **kw):
    if sheet.kind == "attention":
        d = sheet.doc
        return plant_attention(d["q"], d["k"], d["v"], d.get("mask", "none"), bug, **kw)
    return plant_block(sheet.doc, bug, **kw)


def answers(trace, asked, decimals=4):
    """The asked cells of a trace, rounded as a student hands them in (masked scores as null)."""
    out: dict = {"version": 1}
    for path in asked:
        node, target = trace, out
        parts = path.split(".")
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
            nxt = parts[parts.index(part) + 1]
            if isinstance(target, list):
                while len(target) <= int(part):
                    target.append({})
                target = target[int(part)]
            else:
                target = target.setdefault(part, [] if nxt.isdigit() else {})
        table = node[parts[-1]] if isinstance(node, dict) else node[int(parts[-1])]
        target[parts[-1]] = [[None if v is None else round(v, decimals) for v in row] for row in table]
    return out


def verdicts(sheet, doc):
    return check(sheet, parse_answers(json.loads(json.dumps(doc)), sheet, "answers.json"))


SHEETS = [("attention", {}, s) for s in (0, 1, 2)] + [("block", {}, s) for s in (0, 1)] + \
         [("block", {"norm": "pre"}, 5), ("block", {"mask": "causal"}, 9)]


@pytest.fixture(scope="module", params=SHEETS, ids=lambda p: f"{p[0]}-{p[1].get('norm', '')}"
                f"{p[1].get('mask', '')}-{p[2]}")
def sheet(request):
    kind, kw, seed = request.param
    return new_sheet(kind, seed, **kw)


# ---- the key -------------------------------------------------------------------------------------

def test_key_agrees_with_the_reference_and_the_second_implementation(sheet):
    from glassformer.lesson.exercises.generate import key_text
    key = json.loads(key_text(sheet.doc))
    assert max_difference(key, run_reference(sheet.doc)) < 1e-12
    mine = plant(sheet)
    for path in sheet.asked:
        node_k, node_m = key, mine
        for part in path.split("."):
            node_k = node_k[int(part)] if isinstance(node_k, list) else node_k[part]
            node_m = node_m[int(part)] if isinstance(node_m, list) else node_m[part]
        a = np.array([[-np.inf if v is None else v for v in r] for r in node_k])
        b = np.array([[-np.inf if v is None else v for v in r] for r in node_m])
        assert np.array_equal(np.isinf(a), np.isinf(b)) and np.allclose(a[np.isfinite(a)], b[np.isfinite(b)],
                                                                         atol=1e-12), path


def test_sheet_numbers_are_small_integers_or_halves(sheet):
    def numbers(v):
        if isinstance(v, list):
            for item in v:
                yield from numbers(item)
        elif isinstance(v, dict):
            for key, item in v.items():
                if key != "eps":
                    yield from numbers(item)
        elif isinstance(v, float):
            yield v
    values = list(numbers(sheet.doc))
    assert values and all(abs(v) <= 3 and (2 * v).is_integer() for v in values)


# ---- verdicts --------------------------------------------------------------------------------

def test_right_answers_are_right_with_no_bug(sheet):
    report = verdicts(sheet, answers(plant(sheet), sheet.asked))
    assert report.verdict == "right" and report.bugs == []
    assert [c.path for c in report.cells] == sheet.asked and all(c.bug is None for c in report.cells)


def test_each_planted_bug_is_named(sheet):
    planted = [b.id for b in BUGS if not_covered(b, sheet) is None]
    assert len(planted) >= (6 if sheet.kind == "attention" else 13)
    for bug in planted + (["causal-off-by-one+"] if sheet.mask == "causal" else []):
        report = verdicts(sheet, answers(plant(sheet, bug), sheet.asked))
        assert report.bugs == [bug.rstrip("+")], (bug, report.as_json())
        assert report.verdict == "wrong"
        assert all(c.verdict in ("right", "carried") or c.bug == bug.rstrip("+") for c in report.cells)


def test_a_slip_is_wrong_where_it_is_and_carried_after_it():
    sheet = new_sheet("attention", 4, mask="none")
    d = sheet.doc
    scores = [[sum(a * b for a, b in zip(qi, kj, strict=True)) for kj in d["k"]] for qi in d["q"]]
    scores[1][2] += 1.0
    report = verdicts(sheet, answers(plant(sheet, scores=scores), sheet.asked))
    got = {c.path: (c.verdict, c.bug) for c in report.cells}
    assert got == {"scores": ("wrong", "slip"), "scaled_scores": ("carried", None),
                   "weights": ("carried", None), "output": ("carried", None)}
    assert report.bugs == [] and report.verdict == "wrong"
    assert report.cells[0].off == [[1, 2]]


def test_a_slip_in_a_block_head_costs_once():
    sheet = new_sheet("block", 2)
    report = verdicts(sheet, answers(plant(sheet, slip=(1, 0, 2, 2.0)), sheet.asked))
    got = {c.path: (c.verdict, c.bug) for c in report.cells}
    assert got["self_attention.heads.1.scores"] == ("wrong", "slip")
    assert got["self_attention.heads.1.scaled_scores"] == ("carried", None)
    assert all(v == ("right", None) for p, v in got.items() if ".heads.0." in p or p.endswith((".q", ".k", ".v")))
    assert sum(v[0] == "wrong" for v in got.values()) == 1 and report.bugs == []


def test_rounding_every_intermediate_is_still_right():
    """A student who rounds each table to four decimals and goes on from the rounded numbers."""
    sheet = new_sheet("block", 1)
    from glassformer.lesson.exercises.bugs import cells
    own, values = {}, {}
    for cell in cells(sheet):
        values[cell.path] = np.round(cell.fn(*[values[p] for p in cell.inputs]), 4)
        own[cell.path] = values[cell.path]
    report = check(sheet, {p: own[p] for p in sheet.asked})
    assert report.verdict == "right", report.as_json()


def test_a_subset_of_cells_is_judged_alone():
    sheet = new_sheet("block", 0)
    full = answers(plant(sheet, "softmax-over-queries"), sheet.asked)
    only = {"self_attention": {"heads": [{}, {"weights": full["self_attention"]["heads"][1]["weights"]}]}}
    report = verdicts(sheet, only)
    assert [(c.path, c.verdict, c.bug) for c in report.cells] == [
        ("self_attention.heads.1.weights", "wrong", "softmax-over-queries")]


# ---- the audit ---------------------------------------------------------------------------------

def test_audit_rejects_a_sheet_on_which_two_bugs_coincide():
    sheet = new_sheet("attention", 0)
    sheet.asked = ["scaled_scores"]          # no-scale and scale-after-softmax both leave S unscaled here
    result = audit(sheet)
    assert not result.ok
    assert any("no-scale and scale-after-softmax" in p for p in result.problems)
    with pytest.raises(UsageError, match="passes the audit"):
        new_sheet("attention", 0, asked=["scaled_scores"])


def test_audit_rejects_a_bug_that_changes_nothing():
    sheet = new_sheet("attention", 0, mask="none")
    sheet.doc["k"] = [row[:] for row in sheet.doc["q"]]                   # S = QQᵀ is symmetric: KQᵀ = QKᵀ
    from glassformer.lesson.exercises.sheet import from_spec
    twin = from_spec(sheet.doc, "sheet")
    twin.asked, twin.decimals = sheet.asked, 4
    assert any(p.startswith("transposed-scores changes no asked cell") for p in audit(twin).problems)


def test_uncoverable_bugs_are_listed_with_why():
    one_head = new_sheet("attention", 1)
    assert "√d_model = √d_k" in not_covered(next(b for b in BUGS if b.id == "scale-by-d-model"), one_head)
    assert {i["bug"] for i in one_head.audit["not_covered"]} >= {"scale-by-d-model", "ln-unbiased-variance"}
    assert "causal-off-by-one" in one_head.audit["covered"]


# ---- what a teacher hands out ------------------------------------------------------------------------

def test_moodle_xml_parses_with_one_feedback_per_bug(sheet):
    root = ET.fromstring(moodle_xml([sheet], "en"))
    questions = root.findall("question[@type='numerical']")
    assert len(questions) == len(sheet.asked)
    feedback = " ".join(a.findtext("feedback/text") for q in questions for a in q.findall("answer"))
    for bug in sheet.audit["covered"]:
        assert f"{bug}:" in feedback, bug
    for q in questions:
        right = [a for a in q.findall("answer") if a.get("fraction") == "100"]
        assert len(right) == 1 and float(right[0].findtext("tolerance")) == pytest.approx(5e-5)


def test_worksheets_name_every_asked_cell(sheet):
    md, page = worksheet_md(sheet, "en"), worksheet_html(sheet, "zh")
    for path in sheet.asked:
        assert f"`{path}`" in md and f"<code>{path}</code>" in page
    assert page.startswith("<!doctype html>") and "@media print" in page


# ---- the command line --------------------------------------------------------------------------

def test_cli_class_set_and_a_students_check(tmp_path, capsys):
    assert main(["exercise", "new", "--kind", "block", "--seed", "7", "--count", "3", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "audit passed" in printed and "post-norm-instead-of-pre" in printed
    rows = (tmp_path / "keys.csv").read_text(encoding="utf-8").splitlines()
    assert rows[0] == "seed,cell,row,column,key" and {r.split(",")[0] for r in rows[1:]} == {"7", "8", "9"}
    folder = tmp_path / "seed-8"
    for name in ("exercise.json", "key.json", "sheet.json", "worksheet.md", "worksheet.html", "moodle.xml"):
        assert (folder / name).is_file()
    from glassformer.lesson.exercises.sheet import load_sheet
    sheet = load_sheet(str(folder / "exercise.json"))
    (tmp_path / "a.json").write_text(json.dumps(answers(plant(sheet, "ln-unbiased-variance"), sheet.asked)))
    assert main(["exercise", "check", str(folder / "exercise.json"), str(tmp_path / "a.json"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["verdict"] == "wrong" and got["bugs"] == ["ln-unbiased-variance"]
    assert {c["path"] for c in got["cells"] if c["verdict"] == "wrong"} == {"sublayers.0.normed", "output"}
    assert main(["exercise", "check", str(folder / "exercise.json"), str(tmp_path / "a.json"), "--lang", "zh"]) == 0
    assert "ln-unbiased-variance" in capsys.readouterr().out


def test_key_json_is_what_trace_prints(tmp_path, capsys):
    assert main(["exercise", "new", "--kind", "attention", "--seed", "2", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["trace", str(tmp_path / "exercise.json")]) == 0
    assert capsys.readouterr().out == (tmp_path / "key.json").read_text(encoding="utf-8")


BAD = {
    "malformed.json": ('{"scores": [[1, 2', "invalid JSON"),
    "shape.json": ('{"weights": [[1, 2], [3, 4], [5, 6]]}', "weights[0]: expected 3 numbers"),
    "rows.json": ('{"output": [[1, 2]]}', "output: expected 3×2, got 1 rows"),
    "nan.json": ('{"weights": [[NaN, 0, 0], [0, 0, 0], [0, 0, 0]]}', "weights[0][0]: non-finite number"),
    "inf.json": ('{"output": [[Infinity, 0], [0, 0], [0, 0]]}', "output[0][0]: non-finite number"),
    "unknown.json": ('{"attention": []}', "attention: unknown cell"),
    "text.json": ('{"scores": [["a", 0, 0], [0, 0, 0], [0, 0, 0]]}', "scores[0][0]: expected a number"),
    "kind.json": ('{"kind": "encoder_block"}', "kind: the sheet is attention"),
    "list.json": ("[1, 2]", "expected a JSON object"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_answers_are_one_line_and_exit_2(tmp_path, capsys, name):
    assert main(["exercise", "new", "--kind", "attention", "--seed", "1", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    text, words = BAD[name]
    (tmp_path / name).write_text(text)
    assert main(["exercise", "check", str(tmp_path / "exercise.json"), str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and "Traceback" not in err, err


def test_not_a_sheet_and_absurd_sizes_are_refused(tmp_path, capsys):
    assert main(["exercise", "new", "--kind", "attention", "--seed", "1", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    (tmp_path / "a.json").write_text("{}")
    big = {"version": 1, "kind": "attention", "q": [[1.0, 0.0]] * 100, "k": [[1.0, 0.0]] * 3,
           "v": [[1.0, 0.0]] * 3}
    (tmp_path / "big.json").write_text(json.dumps(big))
    (tmp_path / "huge.json").write_text(" " * (300 << 10) + "{}")
    cases = [(tmp_path / "key.json", "not a sheet"), (tmp_path / "big.json", "MAX_SHEET_ROWS"),
             (tmp_path / "huge.json", "MAX_SHEET_FILE_BYTES")]
    for path, words in cases:
        assert main(["exercise", "check", str(path), str(tmp_path / "a.json")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    assert main(["exercise", "new", "--kind", "block", "--count", "100000", "--out", str(tmp_path / "x")]) == 2
    assert "MAX_SHEET_COUNT" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_an_empty_hand_in_is_empty_and_a_partial_one_says_what_it_left_out(tmp_path, capsys):
    assert main(["exercise", "new", "--kind", "block", "--seed", "3", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    from glassformer.lesson.exercises.sheet import load_sheet
    sheet = load_sheet(str(tmp_path / "exercise.json"))
    (tmp_path / "empty.json").write_text("{}")
    assert main(["exercise", "check", str(tmp_path / "exercise.json"), str(tmp_path / "empty.json"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["verdict"] == "empty" and got["filled"] == 0 and got["left_out"] == sheet.asked
    assert main(["exercise", "check", str(tmp_path / "exercise.json"), str(tmp_path / "empty.json"),
                 "--lang", "en"]) == 0
    assert "empty hand-in" in capsys.readouterr().out
    full = answers(plant(sheet), sheet.asked)
    part = {"self_attention": full["self_attention"]}                   # the heads, the concat and W^O only
    (tmp_path / "part.json").write_text(json.dumps(part))
    assert main(["exercise", "check", str(tmp_path / "exercise.json"), str(tmp_path / "part.json"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    filled = [c["path"] for c in got["cells"]]
    assert got["verdict"] == "right" and got["filled"] == len(filled) > 0
    assert got["left_out"] == [p for p in sheet.asked if p not in filled] and "output" in got["left_out"]
    assert main(["exercise", "check", str(tmp_path / "exercise.json"), str(tmp_path / "part.json"),
                 "--lang", "en"]) == 0
    assert f"{len(got['left_out'])} of the {len(sheet.asked)} asked cells left out" in capsys.readouterr().out


@pytest.mark.parametrize("what", ["/dev/zero", "fifo"])
def test_answers_from_a_device_or_a_fifo_are_refused_without_reading(tmp_path, capsys, what):
    import os
    import subprocess
    import sys
    assert main(["exercise", "new", "--kind", "attention", "--seed", "1", "--out", str(tmp_path)]) == 0
    path = what
    if what == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    args = ["exercise", "check", str(tmp_path / "exercise.json"), path]
    program = f"import sys; from glassformer.cli import main; sys.exit(main({args!r}))"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not a regular file" in done.stderr and done.stderr.count("\n") == 1


def _hand_made(tmp_path, doc) -> str:
    folder = tmp_path / "sheet"
    folder.mkdir()
    (folder / "exercise.json").write_text(json.dumps(doc))
    return str(folder / "exercise.json")


@pytest.mark.parametrize("masking", [{"key_padding": [False, False, True]},
                                     {"mask": [[True, False, True], [True, True, True]]}])
def test_a_sheet_with_key_padding_or_a_mask_table_is_checked(tmp_path, capsys, masking):
    """A mask table or key padding is an (n, m) table, not a word: checking such a sheet was a traceback."""
    q, k, v = [[1, 0], [0, 1]], [[1, 0], [0, 1], [1, 1]], [[1, 2], [3, 4], [5, 6]]
    sheet = _hand_made(tmp_path, {"version": 1, "kind": "attention", "q": q, "k": k, "v": v, **masking})
    seen = [[True, True, False]] * 2 if "key_padding" in masking else masking["mask"]
    scores = [[sum(a * b for a, b in zip(qi, kj, strict=True)) for kj in k] for qi in q]
    scaled = [[x / math.sqrt(2) for x in row] for row in scores]
    weights = [_softmax_row(row, s) for row, s in zip(scaled, seen, strict=True)]
    output = [[sum(w * vj[t] for w, vj in zip(row, v, strict=True)) for t in range(2)] for row in weights]
    answer = {"version": 1, "scores": scores, "weights": weights, "output": output,
              "scaled_scores": [[round(x, 4) if s_ else None for x, s_ in zip(row, s, strict=True)]
                                for row, s in zip(scaled, seen, strict=True)]}
    answer = {key: [[None if x is None else round(x, 4) for x in row] for row in val] if key != "version" else val
              for key, val in answer.items()}
    (tmp_path / "answers.json").write_text(json.dumps(answer))
    assert main(["exercise", "check", sheet, str(tmp_path / "answers.json"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "right", report


def test_a_block_whose_heads_concat_is_narrower_than_d_model_is_checked(tmp_path, capsys):
    """One head of d_v 2 in a d_model 4 block: leaving out W^O is not a mistake this sheet can show (the concat
    cannot be added to x), not a traceback; the trace's own numbers are right."""
    assert main(["exercise", "new", "--kind", "block", "--seed", "0", "--out", str(tmp_path / "gen")]) == 0
    doc = json.loads((tmp_path / "gen" / "exercise.json").read_text())
    attention = doc["self_attention"]
    d_v = len(attention["heads"][0]["w_v"][0])
    attention["heads"], attention["w_o"] = attention["heads"][:1], attention["w_o"][:d_v]
    sheet = _hand_made(tmp_path, doc)
    capsys.readouterr()
    assert main(["trace", sheet, "-o", str(tmp_path / "trace.json")]) == 0
    trace = json.loads((tmp_path / "trace.json").read_text())
    asked = ["self_attention.concat", "self_attention.output", "output"]
    (tmp_path / "answers.json").write_text(json.dumps(answers(trace, asked)))
    assert main(["exercise", "check", sheet, str(tmp_path / "answers.json"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "right", report


def test_a_wrong_cell_names_six_entries_and_counts_the_rest():
    """A mistake in more than six entries: six are named, the rest counted (they were dropped without a word)."""
    from glassformer.lesson.exercises.check import report_text

    sheet = new_sheet("block", 0)
    report = verdicts(sheet, answers(plant(sheet, "no-residual"), sheet.asked))
    wrong = [c for c in report.cells if c.verdict == "wrong" and len(c.off) > 6]
    assert wrong, [(c.path, c.verdict, len(c.off)) for c in report.cells]
    text = report_text(report, "en")
    assert f", … {len(wrong[0].off) - 6} more]" in text, text
    assert f"，…另 {len(wrong[0].off) - 6} 个]" in report_text(report, "zh")
