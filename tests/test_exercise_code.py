"""A student's own code checked: right ones right, each bug of the library named, shape errors named as
such, the lesson's properties checked, hostile code contained.

The student code is written by hand in tests/exercise_code/ (loops and plain NumPy, its own bug switches),
never generated from the library's switches, so a checker that named the wrong bug, or a library whose
variant computed something no student's code computes, would fail here. Many seeds run in one process.
"""

from __future__ import annotations

import ast
import itertools
import json
import math
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from glassformer import limits
from glassformer.cli import main
from glassformer.lesson.exercises.bugs import BY_ID, RIGHT, Switches
from glassformer.lesson.exercises.compare import SHAPE, prepared, variant_outputs
from glassformer.lesson.exercises.judge import check_code, check_function, check_source
from glassformer.lesson.exercises.tasks import TASKS, compute, probes
from glassformer.lesson.reference import layer_norm as reference_layer_norm
from glassformer.lesson.reference import run_reference

HERE = Path(__file__).resolve().parent / "exercise_code"
SEEDS = list(range(10))
FILES = {"attention": "attention.py", "causal-mask": "causal_mask.py", "layer-norm": "layer_norm.py",
         "multi-head": "multi_head.py", "encoder-block": "encoder_block.py", "decoder-block": "decoder_block.py",
         "positions": "sinusoidal_positions.py"}


def plant(task: str, bugs=()) -> str:
    """The hand-written implementation of `task` with `bugs` switched on (a trailing + is a bug's second reading)."""
    source = (HERE / FILES[task]).read_text(encoding="utf-8")
    assert "\nBUGS = set()\n" in source
    return source.replace("\nBUGS = set()\n", f"\nBUGS = {set(bugs)!r}\n" if bugs else "\nBUGS = set()\n")


def answer(name: str, **replace: str) -> str:
    source = (HERE / name).read_text(encoding="utf-8")
    for old, new in replace.items():
        source = source.replace(old, new)
    return source


# ---- the lesson's computation on the probes is the reference's --------------------------------------


def _lists(a):
    return np.asarray(a).tolist()


def _heads(p):
    return {"heads": [{k: _lists(v) for k, v in h.items()} for h in p["heads"]], "w_o": _lists(p["w_o"])}


def _block_doc(kind, x, params, **more):
    doc = {"kind": kind, "x": _lists(x), "self_attention": _heads(params["self_attention"]),
           "ffn": {k: _lists(v) for k, v in params["ffn"].items()},
           "layer_norms": [{k: _lists(v) for k, v in n.items()} for n in params["layer_norms"]],
           "eps": params["eps"], **more}
    if "cross_attention" in params:
        doc["cross_attention"] = _heads(params["cross_attention"])
    return doc


@pytest.mark.parametrize("seed", [0, 7])
def test_the_lesson_computation_on_every_probe_is_the_reference(seed):
    """The library's default switches on the code tasks' probes (multi-head, decoder and pre-norm blocks, which
    no sheet has) agree with lesson/reference.py, written separately from the formulas, and the position table
    with the model's float64 table (both layouts)."""
    import torch

    from glassformer.model.masks import causal_mask
    from glassformer.model.positions import sinusoidal_positions

    for name, task in TASKS.items():
        found, _ = probes(task, seed)
        for p in found:
            got = compute(task, p.inputs)
            if name == "attention":
                doc = {"kind": "attention", "q": _lists(p.args[0]), "k": _lists(p.args[1]), "v": _lists(p.args[2])}
                if len(p.args) == 4:
                    doc["mask"] = _lists(p.args[3])
                ref = run_reference(doc)
                want = (ref["weights"], ref["output"])
            elif name == "multi-head":
                x, params = p.args[:2]
                eye = np.eye(x.shape[1]).tolist()
                doc = {"kind": "encoder_block", "x": _lists(x), "self_attention": _heads(params),
                       "ffn": {"w_1": eye, "w_2": eye}}
                if len(p.args) == 3:
                    doc["mask"] = _lists(p.args[2])
                want = (run_reference(doc)["self_attention"]["output"],)
            elif name == "encoder-block":
                want = (run_reference(_block_doc("encoder_block", p.args[0], p.args[1],
                                                 norm=p.kwargs.get("norm", "post")))["output"],)
            elif name == "decoder-block":
                y, memory, params = p.args
                want = (run_reference(_block_doc("decoder_block", y, params, memory=_lists(memory),
                                                 mask="causal"))["output"],)
            elif name == "layer-norm":
                want = (reference_layer_norm(*p.args),)
            elif name == "causal-mask":
                want = (causal_mask(p.args[0]).numpy(),)
            else:
                want = (sinusoidal_positions(*p.args, dtype=torch.float64).numpy(),)
                halves = sinusoidal_positions(*p.args, dtype=torch.float64, layout="halves").numpy()
                np.testing.assert_allclose(compute(task, p.inputs, Switches(pe_layout="halves"))[0], halves,
                                           atol=1e-12)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(np.asarray(g, dtype=float), np.asarray(w, dtype=float), atol=1e-12,
                                           err_msg=f"{name} {p.shows}")


def test_probes_are_what_the_issue_asks_for():
    """n ≠ m, d_k ≠ d_v ≠ d_model, more than one head, a causal and a padding mask, a query with no visible key,
    a single row — and the same seed draws the same numbers."""
    found, _ = probes(TASKS["attention"], 3)
    q, k, v, *mask = zip(*[(p.args + (None,))[:4] for p in found], strict=True)
    assert any(a.shape[0] != b.shape[0] for a, b in zip(q, k, strict=True))
    assert any(a.shape[1] != b.shape[1] for a, b in zip(k, v, strict=True))
    masks = [m for m in mask[0] if m is not None]
    assert any((~m.any(axis=1)).any() for m in masks)                      # a row with no visible key
    assert any((~m.any(axis=0)).any() for m in masks)                      # padding: a key nobody sees
    assert any(np.array_equal(m, np.tril(np.ones(m.shape, dtype=bool))) for m in masks)
    assert any(a.shape[0] == 1 for a in q)
    heads = [p.args[1] for p in probes(TASKS["multi-head"], 3)[0]]
    assert any(len(h["heads"]) > 1 and len({h["heads"][0]["w_q"].shape[1], h["heads"][0]["w_v"].shape[1],
                                            h["w_o"].shape[1]}) == 3 for h in heads)
    again, _ = probes(TASKS["attention"], 3)
    assert all(np.array_equal(a.args[0], b.args[0]) for a, b in zip(found, again, strict=True))
    assert not np.array_equal(probes(TASKS["attention"], 4)[0][0].args[0], found[0].args[0])


# ---- right, each bug, pairs ---------------------------------------------------------------------------


@pytest.mark.parametrize("task", list(TASKS))
def test_a_right_implementation_is_right_on_ten_seeds(task):
    reports = check_source(plant(task), task, SEEDS, lang="en")
    assert [(r.verdict, r.bugs) for r in reports] == [("right", [])] * len(SEEDS), reports[0].message
    assert all(p["held"] is True for r in reports for p in r.properties)


def _bug_cases():
    cases = []
    for name, task in TASKS.items():
        for bug in task.bugs:
            if name == "decoder-block" and bug == "masked-row-not-zeroed":
                continue                      # a causal decoder has no masked-out row: only with another bug
            cases += [(name, bug + "+" * r) for r in range(len(BY_ID[bug].readings))]
    return cases


@pytest.mark.parametrize("task,planted", _bug_cases())
def test_each_bug_written_by_hand_is_named_on_every_seed(task, planted):
    reports = check_source(plant(task, [planted]), task, SEEDS, lang="en")
    bug = planted.rstrip("+")
    assert [(r.verdict, r.bugs) for r in reports] == [("wrong", [bug])] * len(SEEDS), \
        [(r.seed, r.verdict, r.bugs, r.message[:200]) for r in reports if r.bugs != [bug]][:2]
    assert all(r.failing is not None and r.failing["got"] != r.failing["expected"] for r in reports)


SCOPED = [("encoder-block", "ln-eps-outside-sqrt@ffn"), ("encoder-block", "no-residual@self_attention"),
          ("encoder-block", "ln-across-positions+@self_attention"), ("decoder-block", "no-scale@cross_attention"),
          ("decoder-block", "transposed-scores@self_attention"),
          ("decoder-block", "softmax-over-queries@cross_attention"),
          ("decoder-block", "no-output-projection@cross_attention"),
          ("decoder-block", "heads-concat-reversed@self_attention"), ("decoder-block", "ln-unbiased-variance@ffn"),
          ("decoder-block", "ln-across-positions@cross_attention"), ("decoder-block", "no-residual@cross_attention")]


@pytest.mark.parametrize("task,planted", SCOPED)
def test_a_bug_in_one_sub_layer_of_a_block_is_named_with_its_sub_layer(task, planted):
    """A block written without a shared helper can hold a mistake in one sub-layer alone: named, and where."""
    bug, site = planted.split("@")
    reports = check_source(plant(task, [planted]), task, [0, 1, 2], lang="en")
    assert [(r.verdict, r.bugs, r.where) for r in reports] == [("wrong", [bug.rstrip("+")],
                                                                {bug.rstrip("+"): site})] * 3
    assert f"only in the {site.split('_')[0]}" in reports[0].message.lower()


PAIRS = [("attention", ("no-scale", "softmax-over-queries")), ("attention", ("mask-inverted", "masked-row-not-zeroed")),
         ("attention", ("scale-after-softmax", "mask-after-softmax")), ("causal-mask", ("causal-off-by-one",
                                                                                        "mask-inverted")),
         ("layer-norm", ("ln-unbiased-variance", "ln-eps-outside-sqrt")),
         ("multi-head", ("heads-concat-reversed", "no-scale")), ("multi-head", ("no-output-projection",
                                                                               "mask-after-softmax")),
         ("encoder-block", ("ffn-without-relu", "pre-norm-instead-of-post")),
         ("encoder-block", ("no-residual", "ln-unbiased-variance")),
         ("decoder-block", ("causal-off-by-one", "masked-row-not-zeroed")),
         ("decoder-block", ("heads-concat-reversed", "ln-eps-outside-sqrt")),
         ("positions", ("positions-sin-cos-swapped", "positions-halves"))]


@pytest.mark.parametrize("task,pair", PAIRS)
def test_two_bugs_at_once_are_named_as_the_pair(task, pair):
    reports = check_source(plant(task, pair), task, [0, 1, 2], lang="en")
    order = list(BY_ID)
    assert [(r.verdict, r.bugs) for r in reports] == [("wrong", sorted(pair, key=order.index))] * 3


def _distinct(a, b) -> bool:
    for x, y in zip(a, b, strict=True):
        if isinstance(x, str) or isinstance(y, str):
            if isinstance(x, str) != isinstance(y, str):
                return True
            continue
        for u, v in zip(x, y, strict=True):
            u, v = np.asarray(u, dtype=float), np.asarray(v, dtype=float)
            if u.shape != v.shape or (np.isnan(u) != np.isnan(v)).any():
                return True
            if (np.abs(u[~np.isnan(u)] - v[~np.isnan(v)]) > 1e-3).any():
                return True
    return False


@pytest.mark.parametrize("task", list(TASKS))
def test_the_probes_tell_every_bug_and_pair_apart(task):
    """On ten seeds (pairs: three), no two of {the lesson, each bug, each pair} give the same outputs on every
    probe (by more than 1e-3 somewhere) — unless one's bugs include the other's, the extra bug changing nothing there (a
    decoder has no masked-out row for masked-row-not-zeroed to show on, unless another bug makes one)."""
    for seed in SEEDS:
        _, _, right = prepared(task, seed)
        everything = [((), list(right))] + variant_outputs(task, seed, (1, 2) if seed < 3 else (1,))
        for (ia, a), (ib, b) in itertools.combinations(everything, 2):
            if set(ia) <= set(ib) or set(ib) <= set(ia):
                continue
            assert _distinct(a, b), (task, seed, ia, ib)


# ---- properties and shapes ------------------------------------------------------------------------------


def _held(report, name):
    return [p["held"] for p in report.properties if p["name"] == name]


def test_an_attention_right_on_square_masks_but_not_on_padding_is_caught():
    reports = check_source(answer("attention_mask_square_only.py"), "attention", [0, 1, 2], lang="en")
    for r in reports:
        assert r.verdict == "wrong" and r.bugs == []
        square = [p["result"] for p in r.probes if "mask 4×4" in p["call"] or "mask" not in p["call"]]
        assert set(square) == {"right"} and False in _held(r, "padding")


def test_a_layer_norm_whose_rows_share_a_variance_is_caught():
    for r in check_source(answer("layer_norm_pooled_variance.py"), "layer-norm", [0, 1, 2], lang="en"):
        assert r.verdict == "wrong" and _held(r, "rows") == [False]
        assert r.probes[1]["result"] == "right"                              # one row: nothing to share


def test_an_encoder_block_with_positions_of_its_own_breaks_equivariance():
    for r in check_source(answer("encoder_block_positions.py"), "encoder-block", [0, 1], lang="en"):
        assert r.verdict == "wrong" and _held(r, "permutation") == [False]


def test_a_decoder_that_reads_the_future_is_caught():
    for r in check_source(plant("decoder-block", ["unmasked"]), "decoder-block", [0, 1], lang="en"):
        assert r.verdict == "wrong" and r.bugs == [] and _held(r, "future") == [False]
        assert _held(r, "memory-order") == [True]


def test_a_transposed_weights_table_is_a_shape_error_not_a_traceback(capsys):
    path = str(HERE / "attention_weights_transposed.py")
    assert main(["exercise", "check-code", path, "--task", "attention", "--json", "--lang", "en"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "wrong" and out["shape_error"] is True and out["bugs"] == []
    assert "shape" in out["message"] and "transposed" in out["message"]
    assert out["shape"]["output"] == "weights" and out["shape"]["got"][0] == out["shape"]["expected"][0][::-1]
    assert main(["exercise", "check-code", path, "--task", "attention", "--json"]) == 0      # zh says it too
    assert "shape" in json.loads(capsys.readouterr().out)["message"]


@pytest.mark.parametrize("task,bug", [("multi-head", "no-output-projection"), ("attention", "transposed-scores")])
def test_a_shape_error_a_bug_explains_is_named_as_both(task, bug):
    r = check_source(plant(task, [bug]), task, 1, lang="en")
    assert (r.verdict, r.bugs, r.shape_error) == ("wrong", [bug], True) and "shape" in r.message.splitlines()[-1]


@pytest.mark.parametrize("name,task", [("attention_output_only.py", "attention"), ("layer_norm_flat.py", "layer-norm")])
def test_a_wrong_number_or_shape_of_arrays_is_a_shape_error(name, task):
    r = check_source(answer(name), task, 0, lang="en")
    assert (r.verdict, r.shape_error) == ("wrong", True) and "shape" in r.message


def test_a_float32_torch_implementation_is_right_and_torch_inputs_are_tensors():
    r = check_source(answer("attention_torch32.py"), "attention", 0)
    assert r.verdict == "right", r.message
    tensors_only = answer("attention_torch32.py").replace("torch.as_tensor(a, dtype=torch.float32)", "a.float()")
    assert check_source(tensors_only, "attention", 0, inputs="torch").verdict == "right"   # ndarray has no .float()


def test_a_causal_mask_of_0_1_numbers_is_read_as_booleans_an_additive_one_is_not():
    r = check_source(answer("causal_mask_float.py"), "causal-mask", 0, lang="en")
    assert r.verdict == "right" and r.notes == ["the mask's dtype is float64, not bool: 1 was read as True, 0 as False"]
    r = check_source(answer("causal_mask_additive.py"), "causal-mask", 0, lang="en")
    assert r.verdict == "wrong" and len(r.notes) == 1 and "additive mask" in r.notes[0]


def test_the_scale_after_softmax_a_student_writes_is_named():
    r = check_source(answer("attention_scale_after_softmax.py"), "attention", 5, lang="en")
    assert (r.verdict, r.bugs) == ("wrong", ["scale-after-softmax"])
    assert "÷√d_k" in r.message and r.failing["expected"]["weights"] != r.failing["got"]["weights"]


# ---- hostile code ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,verdict,words", [
    ("exit_in_call.py", "error", "sys.exit(3)"),
    ("exit_at_load.py", "error", "sys.exit('bye')"),
    ("segfault.py", "crashed", "SIGSEGV"),
    ("os_exit.py", "crashed", "exit status 0"),
    ("ten_gigabytes.py", "crashed", "MAX_CODE_MEMORY_BYTES"),
    ("raises_in_numpy.py", "error", "LinAlgError"),
    ("imports_the_reference.py", "error", "No module named 'glassformer' in the checked code"),   # was right
])
def test_hostile_code_ends_in_a_verdict(name, verdict, words):
    start = time.monotonic()
    r = check_source(answer(name), "attention", 0, filename=name, lang="en")
    assert r.verdict == verdict and words in r.message, r.message
    assert time.monotonic() - start < 10
    if r.error:                                    # the student's lines only: nothing of numpy or of the checker
        assert r.error["lines"] and all(line["file"] == name for line in r.error["lines"])
    assert check_source(plant("attention"), "attention", 0).verdict == "right"          # the checker is alive


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="finds the checker's pipe through /proc")
def test_answers_forged_on_the_checkers_pipe_end_in_a_verdict(capsys):
    path = str(HERE / "forges_answers.py")
    assert main(["exercise", "check-code", path, "--task", "attention", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] in ("wrong", "crashed") and out["verdict"] != "right"


def test_an_endless_loop_is_a_timeout_within_the_call_limit(monkeypatch):
    monkeypatch.setattr(limits, "MAX_CODE_CALL_SECONDS", 1.5)             # read at each call, as the real 5 s
    start = time.monotonic()
    r = check_source(answer("hang_in_call.py"), "attention", 0, lang="en")
    took = time.monotonic() - start
    assert r.verdict == "timeout" and r.stopped == {"cause": "call", "probe": 1}
    assert limits.MAX_CODE_CALL_SECONDS <= took < limits.MAX_CODE_CALL_SECONDS + 5 < 30


def test_an_endless_loop_at_load_is_a_timeout(monkeypatch):
    monkeypatch.setattr(limits, "MAX_CODE_LOAD_SECONDS", 1.5)
    start = time.monotonic()
    r = check_source(answer("hang_at_load.py"), "attention", 0, lang="en")
    assert r.verdict == "timeout" and r.stopped["cause"] == "load" and time.monotonic() - start < 6


def test_a_megabyte_printed_per_call_is_counted_not_kept():
    """18 calls print 18 MB: more than a file may hold (MAX_CODE_WRITE_BYTES), so only what is kept reaches it."""
    for r in check_source(answer("prints_a_megabyte.py"), "attention", [0, 1]):
        assert r.verdict == "right"
        assert r.output["stdout_bytes"] >= 18_000_000 > limits.MAX_CODE_WRITE_BYTES
        assert len(r.output["stdout"]) <= limits.MAX_CODE_OUTPUT_BYTES


def test_writing_outside_its_folder_is_refused_where_landlock_exists(tmp_path):
    outside = tmp_path / "escaped.txt"
    r = check_source(answer("writes_outside.py", PATH=str(outside)), "attention", 0, lang="en")
    assert r.verdict == "error"
    if r.contained.get("landlock", 0) > 0:
        assert not outside.exists() and r.error["type"] == "PermissionError"
    assert r.contained["rlimits"]["RLIMIT_CORE"] == 0 and r.contained["rlimits"]["RLIMIT_NOFILE"] == \
        limits.MAX_CODE_OPEN_FILES


def test_code_cannot_kill_the_checker_where_landlock_scopes_signals():
    contained = check_source(plant("attention"), "attention", 0).contained
    if contained.get("landlock", 0) < 6:
        pytest.skip("Landlock ABI 6 (signal scoping) is not on this kernel: the code could kill the checker")
    r = check_source(answer("kills_the_checker.py"), "attention", 0, lang="en")
    assert r.verdict == "error" and r.error["type"] == "PermissionError"


# ---- check_function: a notebook's function, forked -----------------------------------------------------


def _row_softmax(s):
    top = np.where(np.isfinite(s), s, -np.inf).max(axis=1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def test_check_function_judges_a_function_with_its_helpers():
    def attention(q, k, v, mask=None):
        s = q @ k.T / math.sqrt(q.shape[1])
        w = _row_softmax(s if mask is None else np.where(mask, s, -np.inf))
        return w, w @ v

    def no_scale(q, k, v, mask=None):
        w = _row_softmax(q @ k.T if mask is None else np.where(mask, q @ k.T, -np.inf))
        return w, w @ v

    assert check_function(attention, "attention", seed=2).verdict == "right"
    r = check_function(no_scale, "attention", seed=2, lang="en")
    assert (r.verdict, r.bugs) == ("wrong", ["no-scale"]) and "no-scale" in r._repr_html_()


def test_check_function_stops_a_hang(monkeypatch):
    monkeypatch.setattr(limits, "MAX_CODE_CALL_SECONDS", 1)

    def attention(q, k, v, mask=None):
        while True:
            pass

    start = time.monotonic()
    assert check_function(attention, "attention").verdict == "timeout"
    assert time.monotonic() - start < 6


# ---- the command line ----------------------------------------------------------------------------------------


def test_check_code_json_carries_the_verdict_bugs_and_probes(tmp_path, capsys):
    path = tmp_path / "mine.py"
    path.write_text(plant("layer-norm", ["ln-unbiased-variance"]), encoding="utf-8")
    assert main(["exercise", "check-code", str(path), "--task", "layer-norm", "--seed", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["verdict"], out["bugs"], out["seed"], out["shape_error"]) == ("wrong", ["ln-unbiased-variance"], 4,
                                                                                False)
    assert len(out["probes"]) == 5 and {p["index"] for p in out["probes"]} == {1, 2, 3, 4, 5}
    assert out["failing"]["inputs"]["x"] and out["failing"]["expected"]["output"] != out["failing"]["got"]["output"]


@pytest.mark.parametrize("content,words", [
    ("def attention(q, k, v, mask=None)\n    return q\n", "not Python: line 1"),
    ("import numpy\n\ndef something_else():\n    pass\n", "no function attention()"),
    (b"\xff\xfe\x00garbage", "not UTF-8"),
    ("x = 1\n" * 60_000, "MAX_CODE_FILE_BYTES"),
])
def test_a_file_that_cannot_be_an_answer_is_one_line_and_exit_2(tmp_path, capsys, content, words):
    path = tmp_path / "answer.py"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    assert main(["exercise", "check-code", str(path), "--task", "attention"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("what", ["/dev/zero", "fifo"])
def test_a_device_or_a_fifo_is_refused_without_reading(tmp_path, what):
    path = what
    if what == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    done = subprocess.run([sys.executable, "-c", "import sys; from glassformer.cli import main; "
                           f"sys.exit(main(['exercise', 'check-code', {path!r}, '--task', 'attention']))"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not a regular file" in done.stderr and done.stderr.count("\n") == 1


def test_new_code_writes_starters_that_are_judged_error_until_written(tmp_path, capsys):
    assert main(["exercise", "new", "--code", "all", "--out", str(tmp_path), "--moodle"]) == 0
    for task in TASKS.values():
        source = (tmp_path / f"{task.function}.py").read_text(encoding="utf-8")
        tree = ast.parse(source)
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == task.function)
        assert ast.unparse(fn.args) == task.signature.replace('"', "'")
        assert task.formula in source and task.zh in source and task.en in source
    r = check_code(str(tmp_path / "attention.py"), "attention")
    assert r.verdict == "error" and r.error["type"] == "NotImplementedError"
    assert main(["exercise", "new", "--code", "attention", "--out", str(tmp_path), "--count", "3"]) == 2


def _coderunner(template: str, student: str) -> dict:
    """The template as CodeRunner's Twig would expand it ({{ STUDENT_ANSWER | e('py') }}), run by Python."""
    escaped = student.replace("\\", "\\\\").replace('"', '\\"')
    program = template.replace("{{ STUDENT_ANSWER | e('py') }}", escaped)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_moodle_coderunner_questions_call_the_checker(tmp_path, capsys):
    assert main(["exercise", "new", "--code", "all", "--out", str(tmp_path), "--moodle", "--seed", "3",
                 "--lang", "en"]) == 0
    quiz = ET.parse(tmp_path / "coderunner.xml").getroot()
    questions = quiz.findall("question[@type='coderunner']")
    assert len(questions) == len(TASKS)
    assert all(q.findtext("coderunnertype") == "python3" and q.findtext("grader") == "TemplateGrader"
               and q.findtext("iscombinatortemplate") == "1" for q in questions)
    q = next(q for q in questions if q.findtext("name/text") == "glassformer: attention")
    assert q.findtext("answerpreload") == (tmp_path / "attention.py").read_text(encoding="utf-8")
    template = q.findtext("template")
    right = _coderunner(template, plant("attention"))
    assert right["fraction"] == 1.0
    wrong = _coderunner(template, answer("attention_scale_after_softmax.py"))
    assert wrong["fraction"] == 0.0 and "scale-after-softmax" in wrong["prologuehtml"]


def test_the_checker_loads_without_torch_or_pydantic():
    """What a Jobe server needs: the checker imports NumPy and the standard library only."""
    code = ("import sys; from glassformer.lesson.exercises.judge import check_source; "
            "print(sorted(m for m in ('torch', 'pydantic') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stderr


def test_a_bug_whose_computation_cannot_take_the_shapes_is_a_shape_failure():
    """K Qᵀ with n ≠ m cannot be masked by an (n, m) table: the library gives SHAPE there, never a broadcast."""
    found, _, _ = prepared("attention", 0)
    outs = dict(variant_outputs("attention", 0))[("transposed-scores",)]
    for p, out in zip(found, outs, strict=True):
        square = p.args[0].shape[0] == p.args[1].shape[0]
        assert (out == SHAPE) != square
    assert compute(TASKS["attention"], found[1].inputs, RIGHT)[0].shape == (4, 4)
