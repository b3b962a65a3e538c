"""`glassformer translate / evaluate / explain` on a tiny trained model: one output line per input
line, length limits, missing models, the `gave` row of explain."""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from glassformer import limits
from glassformer.cli import main
from glassformer.decoding import translator as translator_module
from glassformer.decoding.translator import Translator
from glassformer.errors import UsageError
from glassformer.training.commands import add_train_arguments
from glassformer.training.loop import train

LIMIT = 64  # the tiny preset's max_len


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "run"
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    args = parser.parse_args(["--preset", "tiny", "--limit", "120", "--epochs", "2", "--no-eval", "--quiet",
                              "--threads", "1", "--out", str(out)])
    threads = torch.get_num_threads()
    try:
        assert train(args) == 0
    finally:
        torch.set_num_threads(threads)
    return out


def _run(capsys, monkeypatch, argv, stdin=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_one_output_line_per_input_line_including_empty(model_dir, capsys, monkeypatch):
    code, out, _ = _run(capsys, monkeypatch, ["translate", "--model", str(model_dir)],
                        stdin="我很好。\n\n你叫什么名字？\n   \n谢谢你！\n")
    assert code == 0
    lines = out.split("\n")
    assert lines[-1] == "" and len(lines) - 1 == 5
    assert lines[1] == "" and lines[3] == ""                  # empty and blank input -> empty output line


def test_arguments_and_beam(model_dir, capsys, monkeypatch):
    code, out, _ = _run(capsys, monkeypatch,
                        ["translate", "--model", str(model_dir), "--beam", "3", "我很好。", "谢谢你！"])
    assert code == 0 and len(out.splitlines()) == 2


def test_over_long_input_names_the_limit_and_line(model_dir, capsys, monkeypatch):
    long_line = "我" * (LIMIT + 6)
    code, out, err = _run(capsys, monkeypatch, ["translate", "--model", str(model_dir)],
                          stdin=f"你好。\n{long_line}\n")
    assert code == 2 and out == ""
    assert f"limit of {LIMIT}" in err and "line 2" in err and len(err.strip().splitlines()) == 1
    code, out, _ = _run(capsys, monkeypatch, ["translate", "--model", str(model_dir), "--truncate"],
                        stdin=f"你好。\n{long_line}\n")
    assert code == 0 and len(out.splitlines()) == 2


def test_verbose_goes_to_stderr(model_dir, capsys, monkeypatch):
    code, out, err = _run(capsys, monkeypatch, ["translate", "--model", str(model_dir), "--verbose",
                                                "我昨天给了他一本书。"])
    assert code == 0 and len(out.splitlines()) == 1
    assert "我" in err and "／" in err


def test_missing_model_says_how_to_train_one(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GLASSFORMER_MODEL", raising=False)
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(capsys, monkeypatch, ["translate", "你好"])
    assert code == 2 and "make demo" in err and "runs/default" in err
    monkeypatch.setenv("GLASSFORMER_MODEL", str(tmp_path / "nowhere"))
    code, _, err = _run(capsys, monkeypatch, ["translate", "你好"])
    assert code == 2 and "nowhere" in err


def test_env_variable_picks_the_model(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GLASSFORMER_MODEL", str(model_dir))
    monkeypatch.chdir(tmp_path)
    code, out, _ = _run(capsys, monkeypatch, ["translate", "你好"])
    assert code == 0 and len(out.splitlines()) == 1


@pytest.mark.slow
def test_subprocess_exit_status_without_traceback(model_dir):
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "glassformer.cli", "translate", "--model", str(model_dir)],
                         input="我" * (LIMIT + 1) + "\n", capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr and f"{LIMIT}" in run.stderr


def test_explain_shows_the_gave_row(model_dir, capsys, monkeypatch):
    target = "I gave him a book yesterday."
    code, out, _ = _run(capsys, monkeypatch, ["explain", "我昨天给了他一本书。", "--target", target,
                                              "--model", str(model_dir), "--json"])
    assert code == 0
    walk = json.loads(out)
    assert walk["units"] == ["我", "昨天", "给", "了", "他", "一", "本", "书", "。"]
    assert walk["inputs"][0] == "<s>" and len(walk["rows"]) == len(walk["inputs"])
    focus = walk["focus"]
    assert focus is not None
    row = walk["rows"][focus["row"]]
    seen = "".join(row["sees"][1:]).replace("▁", " ").split()
    assert seen[-1] == "gave" and "him" not in seen                    # sees up to gave, never him
    # every number against a teacher-forced pass computed here: softmax of the model's logits per row
    translator = Translator.load(model_dir)
    cfg, tok = translator.model.cfg, translator.target
    inputs = [cfg.bos_id, *tok.encode(target)]
    with torch.no_grad():
        logits = translator.model(torch.tensor([translator.source.analyse("我昨天给了他一本书。").ids]),
                                  torch.tensor([inputs]))[0]                 # (tgt, vocab)
    probs = torch.softmax(logits.double(), dim=-1)
    assert len(walk["rows"]) == len(inputs)
    assert walk["inputs"][1:] == [tok.id_to_token(i) for i in inputs[1:]]
    him = tok.token_to_id(tok.tokens("him")[0])
    assert focus["token"] == tok.tokens("him")[0] and row["next"] == focus["token"]    # teacher-forced: him
    assert focus["p"] == pytest.approx(float(probs[focus["row"], him]), abs=1e-4) and focus["p"] == row["p_next"]
    for r, labels in zip(walk["rows"], [*inputs[1:], cfg.eos_id], strict=True):
        p = probs[r["row"]]
        assert r["p_next"] == pytest.approx(float(p[labels]), abs=1e-4)
        assert r["rank"] == int((p > p[labels]).sum()) + 1
        values, ids = p.topk(5)
        assert [c["p"] for c in r["top"]] == pytest.approx(values.tolist(), abs=1e-4)
        assert [c["token"] for c in r["top"]] == ["</s>" if i == cfg.eos_id else tok.id_to_token(i)
                                                 for i in ids.tolist()]
        assert len(r["sees"]) == r["row"] + 1
        assert all(0.0 < h["weight"] <= 1.0 and h["unit"] in walk["units"] for h in r["cross_attention"])
    code, text, _ = _run(capsys, monkeypatch, ["explain", "我昨天给了他一本书。", "--model", str(model_dir)])
    assert code == 0 and "row 0: sees <s>" in text


@pytest.mark.slow
def test_evaluate_prints_bleu_and_chrf_with_signatures(model_dir, capsys, monkeypatch):
    code, out, _ = _run(capsys, monkeypatch, ["evaluate", "--model", str(model_dir), "--split", "dev",
                                              "--input", "gold", "--json", "--compile", "off"])
    assert code == 0
    result = json.loads(out)
    assert result["sentences"] == 232 and 0.0 <= result["bleu"] <= 100.0 and 0.0 <= result["chrf"] <= 100.0
    assert "nrefs:1" in result["bleu_signature"] and "nc:6" in result["chrf_signature"]
    assert result["beam"] == 4 and result["alpha"] == 1.0          # scores are reported with beam 4 (docs)


def test_explain_of_a_greedy_output_cut_at_the_limit_ends_without_eos(model_dir):
    """A model that never chooses EOS (planted on its logits) runs to the output limit: the walk says it
    was cut, and its last row predicts the model's own choice, not EOS."""
    from glassformer.decoding.search import output_limits
    from glassformer.interpret.explain import explain, render

    translator = Translator.load(model_dir)
    cfg = translator.model.cfg

    def no_eos(logits, name):
        logits = logits.clone()
        logits[..., cfg.eos_id] = -torch.inf
        return logits

    ids = translator.source.analyse("我很好。").ids
    limit = int(output_limits(torch.tensor([[False] * len(ids)]), cfg.max_len)[0])
    with translator.model.intervene({"logits": no_eos}):
        walk = explain(translator, "我很好。")
    assert walk["finished"] is False
    assert len(walk["inputs"]) == limit + 1             # BOS + the limit's tokens; the last row predicts past it
    last = walk["rows"][-1]
    assert last["next"] != "</s>" and last["rank"] == 1 and last["next"] == last["top"][0]["token"]
    assert all(c["token"] != "</s>" for r in walk["rows"] for c in r["top"])
    assert "cut at the length limit" in render(walk)


def test_translate_prints_what_the_translator_returns(model_dir, capsys, monkeypatch):
    lines = ["我很好。", "", "你叫什么名字？", "我昨天给了他一本书。"]
    code, out, _ = _run(capsys, monkeypatch, ["translate", "--model", str(model_dir), "--beam", "2"],
                        stdin="\n".join(lines) + "\n")
    assert code == 0
    assert out.split("\n")[:-1] == Translator.load(model_dir).translate(lines, beam=2)


def test_max_length_cuts_each_output_to_n_tokens(model_dir, capsys, monkeypatch):
    translator = Translator.load(model_dir)
    sources = [translator.source.analyse(t).ids for t in ("我很好。", "你叫什么名字？", "我昨天给了他一本书。")]
    full = translator.translate_ids(sources)
    assert max(len(f) for f in full) >= 3                                    # premise: something to cut
    for n in (1, 2, 3):
        assert translator.translate_ids(sources, max_length=n) == [f[:n] for f in full]   # greedy: a prefix
    code, out, _ = _run(capsys, monkeypatch, ["translate", "--model", str(model_dir), "--max-length", "2",
                                              "我昨天给了他一本书。"])
    assert code == 0 and out == translator.detokenize(full[2][:2]) + "\n"
    code, out, _ = _run(capsys, monkeypatch, ["evaluate", "--model", str(model_dir), "--split", "dev",
                                              "--input", "gold", "--beam", "1", "--max-length", "1", "--json",
                                              "--hypotheses"])
    result = json.loads(out)
    assert code == 0 and result["max_length"] == 1 and len(result["hypotheses"]) == 232
    assert all(len(h.split()) <= 1 for h in result["hypotheses"])              # one sub-word: at most a word
    assert any(h for h in result["hypotheses"])


@pytest.mark.parametrize("value, expected", [("0", "--max-length: expected a positive integer"),
                                             ("x", "--max-length: expected a positive integer"),
                                             ("513", "MAX_SENTENCE_TOKENS"),
                                             (str(LIMIT + 1), f"the model's limit of {LIMIT} target positions")])
def test_max_length_bad_values_are_one_line_exit_2(model_dir, capsys, monkeypatch, value, expected):
    try:
        code, out, err = _run(capsys, monkeypatch, ["translate", "--model", str(model_dir), "--max-length", value,
                                                    "你好"])
    except SystemExit as stop:                                              # argparse's own exit
        code, (out, err) = stop.code, capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and expected in err and "Traceback" not in err


def _known_units(model_dir, n):
    vocab = Translator.load(model_dir).source.vocab
    units = [u for u in vocab.tokens if len(u) == 1 and "\u4e00" <= u <= "\u9fff"]
    return units[:n]


@pytest.mark.slow
def test_patch_json_has_a_heads_by_layers_table(model_dir, capsys, monkeypatch):
    a, b, c = _known_units(model_dir, 3)
    code, out, err = _run(capsys, monkeypatch, ["patch", f"{a}／{b}／{c}", "--corrupt", f"{a}／{c}／{c}",
                                                "--model", str(model_dir), "--json"])
    assert code == 0, err
    result = json.loads(out)
    run = result["runs"][0]
    layers, heads = result["layers"]["decoder"], result["heads"]
    assert len(run["heads"]) == layers and all(len(row) == heads for row in run["heads"])
    assert len(run["positions"]) == result["layers"]["encoder"] + 1 and len(run["positions"][0]) == 3
    assert result["row_sees"][0] == "<s>" and len(result["row_sees"]) == result["row"] + 1
    assert "".join(result["row_sees"][1:]) == "Igave"                         # the row that predicts him
    assert run["nothing"]["fraction"] in (0.0, None)
    assert run["all_heads"]["fraction"] is None or abs(run["all_heads"]["fraction"] - 1.0) < 1e-4
    assert 0.0 < run["p_clean"] < 1.0 and 0.0 < run["p_corrupt"] < 1.0


@pytest.mark.parametrize("case", ["unknown", "counts", "predict", "too-many", "empty", "compare"])
def test_patch_bad_input_is_one_line_exit_2(model_dir, capsys, monkeypatch, case):
    a, b, c = _known_units(model_dir, 3)
    clean = f"{a}／{b}／{c}"
    argv, expected = {
        "unknown": ([clean, "--corrupt", f"{a}／龘／{c}"], "unknown unit '龘'"),
        "counts": ([clean, "--corrupt", f"{a}／{b}"], "patching positions needs the same count"),
        "predict": ([clean, "--corrupt", f"{a}／{c}／{c}", "--predict", "zebra"], "'zebra' is not a word"),
        "too-many": ([clean, *["--corrupt", clean] * 5], "the limit is 4"),
        "empty": (["  ", "--corrupt", clean], "clean: expected a non-empty"),
        "compare": ([clean, "--corrupt", f"{a}／{c}／{c}", "--compare"], "--compare: only with --approximate"),
    }[case]
    code, out, err = _run(capsys, monkeypatch, ["patch", *argv, "--model", str(model_dir)])
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in err


def test_dtype_decodes_through_a_converted_copy_and_names_bad_values(model_dir, capsys, monkeypatch):
    """--dtype bfloat16 / int8 run a converted copy (the reference stays float32); a tiny model's outputs
    may differ, so the check is that each precision prints one line per input and a bad name is exit 2."""
    from glassformer.decoding.commands import _translator
    from glassformer.inference.precision import precision_of

    for dtype in ("float32", "bfloat16", "int8"):
        code, out, _ = _run(capsys, monkeypatch, ["translate", "--model", str(model_dir), "--dtype", dtype,
                                                  "我很好。", "谢谢你！"])
        assert code == 0 and len(out.splitlines()) == 2
        args = argparse.Namespace(model=str(model_dir), device="cpu", beam=1, alpha=None, max_length=None,
                                  dtype=dtype)
        translator = _translator(args, 2)[0]
        assert precision_of(translator.decoding_model()) == dtype and precision_of(translator.model) == "float32"
    with pytest.raises(SystemExit) as info:
        main(["translate", "--model", str(model_dir), "--dtype", "int4", "我"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--dtype" in err and "Traceback" not in err


SENTENCES = ["我很好。", "你叫什么名字？", "谢谢你！"]


def test_compile_on_without_a_compiler_says_so_in_one_line_and_decodes_eagerly(model_dir, capsys, monkeypatch):
    from glassformer.inference import compiler

    code, eager, err = _run(capsys, monkeypatch, ["translate", "--model", str(model_dir), "--compile", "off",
                                                  *SENTENCES])
    assert code == 0 and err == ""
    monkeypatch.setattr(compiler, "cxx_compiler", lambda: None)
    code, out, err = _run(capsys, monkeypatch, ["translate", "--model", str(model_dir), "--compile", "on",
                                                *SENTENCES])
    assert code == 0 and out == eager
    assert len(err.strip().splitlines()) == 1 and "no C++ compiler" in err and "Traceback" not in err


def test_one_sentence_without_a_compiler_hashes_no_weight_and_makes_no_folder(model_dir, tmp_path, capsys,
                                                                             monkeypatch):
    """No C++ compiler: `--compile on` and the default `auto` decode eagerly; nothing is hashed, traced or
    copied for a package, no cache folder is made."""
    from glassformer.inference import compiler

    def never(*args, **kwargs):
        raise AssertionError("a package was looked for")

    monkeypatch.setattr(compiler, "cxx_compiler", lambda: None)
    monkeypatch.setattr(compiler.CompiledDecoder, "__init__", never)
    monkeypatch.setattr(compiler, "package_name", never)
    monkeypatch.setattr(compiler, "_USER_FOLDER", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for mode in ("on", "auto"):
        code, out, _ = _run(capsys, monkeypatch, ["translate", "--model", str(model_dir), "--compile", mode, "我"])
        assert code == 0 and len(out.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_compile_cache_that_is_not_a_folder_is_one_line_exit_2(model_dir, tmp_path, capsys, monkeypatch):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.environ.get("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "c")))
    code, out, err = _run(capsys, monkeypatch, ["translate", "--model", str(model_dir), "--compile", "on",
                                                "--compile-cache", str(not_a_folder / "sub"), "我"])
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--compile-cache" in err


@pytest.mark.xdist_group("model_dir_packages")
@pytest.mark.slow
def test_compiled_translation_prints_the_eager_lines(model_dir, shared_packages, timed_gemms, capsys,
                                                 monkeypatch):
    """--compile on gives the lines of --compile off and says on stderr that it builds the step, and in how
    long; a second run loads the packages and says nothing, and so does --compile auto (which loads them: not eager);
    auto on a job of another shape loads the packages there are and decodes the others' parts eagerly, one line
    naming each, building nothing. Packages for one thread, in the session's folder (as --workers' are)."""
    from glassformer.decoding import translator
    from glassformer.inference import compiler

    if compiler.cxx_compiler() is None:
        pytest.skip("needs a C++ compiler")
    monkeypatch.setattr(translator, "usable_cores", lambda: 1)
    folder = ["--compile-cache", str(shared_packages)]
    args = ["translate", "--model", str(model_dir), "--batch-size", "1", *SENTENCES]
    code, eager, _ = _run(capsys, monkeypatch, [*args, "--compile", "off"])
    code, out, err = _run(capsys, monkeypatch, [*args, "--compile", "on", *folder])
    assert code == 0 and out == eager
    assert "--compile: building" in err and "built in" in err and "Traceback" not in err
    code, again, err = _run(capsys, monkeypatch, [*args, "--compile", "on", *folder])
    assert code == 0 and again == eager and err == ""
    loads, load = [], compiler._load
    monkeypatch.setattr(compiler, "_load", lambda path, packs: loads.append(path.name) or load(path, packs))
    code, again, err = _run(capsys, monkeypatch, [*args, "--compile", "auto", *folder])
    assert code == 0 and again == eager and err == "" and len(loads) == 2, loads   # the source side and the step
    many = ["translate", "--model", str(model_dir), "--batch-size", "8", *SENTENCES, "你好", "我很好。"]
    code, lines, _ = _run(capsys, monkeypatch, [*many, "--compile", "off"])
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: pytest.fail("traced"))
    code, out, err = _run(capsys, monkeypatch, [*many, "--compile", "auto", *folder])
    assert code == 0 and out == lines and "building" not in err and "Traceback" not in err
    notes = err.splitlines()                                                # the many-row source side and step
    assert len(notes) == 2 and all(n.endswith("not built (--compile on builds it); decoding it eagerly")
                                   for n in notes), err
    assert notes[0].startswith("glassformer: --compile auto: the source side not built")
    assert notes[1].startswith("glassformer: --compile auto: the step for beam 1")


@pytest.mark.xdist_group("model_dir_packages")
@pytest.mark.slow
def test_sentences_joining_on_built_packages_get_the_eager_tokens_in_either_order(model_dir, shared_packages,
                                                                                 timed_gemms, monkeypatch):
    """Sentences joining running batches (decoding/joining.py) on the built packages themselves, which read their
    inputs as laid out (a strided view among a join's tensors gave other tokens, where the package tests that run
    the traced module eagerly saw nothing): the batches in the Translator's order (shortest first) and in the
    costliest-first order, each sentence the tokens batch-by-batch eager decoding gives it, in one run a job."""
    from glassformer.decoding import search
    from glassformer.decoding.workers import costliest_first
    from glassformer.inference import compiler

    if compiler.cxx_compiler() is None:
        pytest.skip("needs a C++ compiler")
    lines = ["我很好。", "你叫什么名字？", "谢谢你！", "我们明天去学校。", "他喜欢喝茶。", "这本书很好看。", "你好",
             "我昨天给了他一本书。", "今天天气很好，我们去公园吧。", "我不知道。", "他是我的朋友，我们每天一起去学校。",
             "好", "我想喝水。", "你明天来不来？", "我们一起吃饭吧，我请客。", "书"]
    eager = Translator.load(model_dir)
    ids = sorted((e.ids for e in eager.analyse(lines)), key=len)
    batches = [ids[i: i + 4] for i in range(0, len(ids), 4)]                  # 4 batches of 4, shortest first
    want = eager.decode_batches(batches, 1, 1.0, None, len(lines))
    compiled = Translator.load(model_dir)
    compiled.compile, compiled.compile_cache, compiled.threads = "on", str(shared_packages), 1
    runs, generate = [], search.generate
    monkeypatch.setattr(translator_module, "generate", lambda *a, **k: runs.append(k.get("more")) or generate(*a, **k))
    for order in (range(len(batches)), costliest_first(batches)):
        assert compiled.decode_batches([batches[i] for i in order], 1, 1.0, None, len(lines)) == [want[i]
                                                                                                  for i in order]
    assert len(runs) == 2 and all(more is not None for more in runs)          # one joined run a job


@pytest.mark.slow
def test_patch_approximate_compare_reports_a_correlation(model_dir, capsys, monkeypatch):
    a, b, c = _known_units(model_dir, 3)
    code, out, err = _run(capsys, monkeypatch, ["patch", f"{a}／{b}／{c}", "--corrupt", f"{a}／{c}／{c}",
                                                "--model", str(model_dir), "--approximate", "--compare", "--json"])
    assert code == 0, err
    result = json.loads(out)
    run = result["runs"][0]
    assert result["method"] == "attribution"
    assert run["correlation"] is None or -1.0 - 1e-9 <= run["correlation"] <= 1.0 + 1e-9
    assert run["nothing"]["fraction"] in (0.0, None)


# ---- --workers: a job's batches in worker processes ---------------------------------------------------------

def test_the_shared_count_gives_each_batch_once_costliest_first():
    """Two takers of one job (this process and a helper) through the shared count: each batch once, in the
    costliest-first order, the helper's count kept; a job that another replaced gives its takers nothing more."""
    from multiprocessing import get_context

    from glassformer.decoding.workers import JOB, NEXT, _taken, cost, costliest_first

    batches = [[[5] * n] * rows for n, rows in [(3, 4), (9, 2), (1, 8), (6, 6), (2, 2), (30, 1)]]
    order = costliest_first(batches)
    assert [cost(batches[i]) for i in order] == [84, 72, 44, 38, 34, 20]   # rows x (longest + 8)
    job = [batches[i] for i in order]
    shared = get_context("spawn").Array("q", 2 + 2)                    # one helper
    shared[JOB], shared[NEXT] = 7, 0
    mine, theirs = [], []
    here, there = _taken(shared, 7, job, mine), _taken(shared, 7, job, theirs, helper=0)
    got = [next(here), next(there), next(there), next(here)]
    assert got == job[:4] and mine == [0, 3] and theirs == [1, 2] and shared[2] == 2
    late = _taken(shared, 6, job, [], helper=0)                             # a helper still on an earlier job
    assert list(late) == [] and shared[NEXT] == 4
    assert [*here, *there] == job[4:] and sorted(mine + theirs) == list(range(6)) and shared[2] == len(theirs) == 2
    shared[JOB], shared[NEXT] = 8, 0                                        # the next job began
    assert list(_taken(shared, 7, job, [])) == []


def _slow_start(folder: str):
    """A helper's recipe that takes a minute to start (module level: the spawned helper imports it)."""
    import time

    time.sleep(60)
    return Translator.load(folder)


def _never_starts():
    """A helper's recipe that does not return for a minute (module level: the spawned helper imports it)."""
    import time

    time.sleep(60)


def test_a_job_larger_than_a_pipe_holds_is_not_held_up_by_a_helper_still_starting():
    """The helpers read a job's batches from a file and the pipes carry one line: this process decodes the whole of
    a job of ~2 MB (a socket holds ~200 KB) while its helper still starts, and the job's file is gone after it."""
    import time

    from glassformer.decoding.workers import Workers

    helpers = Workers(_never_starts, 2)
    batches = [[[5 + (i + j) % 50] * (1 + (i + j) % 30) for j in range(32)] for i in range(1500)]
    began = time.monotonic()
    try:
        found = helpers.decode(batches, lambda taken: [[len(b)] for b in taken], 1, 1.0, None, "bound", 48_000)
        assert found == [[len(b)] for b in batches] and helpers.taken() == [0]
        assert time.monotonic() - began < 20 and os.listdir(helpers.folder) == []
    finally:
        helpers.close()
    assert not helpers.processes[0].is_alive() and not os.path.exists(helpers.folder)


def test_a_helper_still_starting_is_not_waited_for(model_dir):
    """The job ends when the count is spent: a helper that never took a batch (still starting) holds nothing up,
    and closing stops it there (it has loaded no package)."""
    import functools
    import time

    from glassformer.decoding.workers import Workers

    lines = ["我很好。", "你叫什么名字？", "谢谢你！", "我们明天去学校。"]
    here = Translator.load(model_dir)
    here.batch_size = 1
    expected = here.translate(lines)
    began = time.monotonic()
    helpers = Workers(functools.partial(_slow_start, str(model_dir)), 2)
    here.workers = 2
    here.use_workers(helpers)
    assert here.translate(lines) == expected and helpers.taken() == [0] and helpers.started() == [False]
    here.close()
    assert time.monotonic() - began < 30 and not helpers.processes[0].is_alive()


def _started_helper(model_dir):
    """Workers of two processes whose helper loads the model from its folder (as a command's), once it has started."""
    import time

    from glassformer.decoding.commands import helper_translator
    from glassformer.decoding.workers import Workers

    helpers = Workers(functools.partial(helper_translator, str(model_dir), "cpu", "float32", "off", None), 2)
    for _ in range(1200):
        if helpers.started() == [True]:
            return helpers
        time.sleep(0.1)
    helpers.close()
    pytest.fail("the helper did not start in 120 s")


LINES = ["我很好。", "你叫什么名字？", "谢谢你！", "我们明天去学校。", "他喜欢喝茶。", "这本书很好看。", "你好",
         "我昨天给了他一本书。", "", "今天天气很好，我们去公园吧。", "我不知道。"]


@pytest.mark.slow
def test_a_last_job_ends_its_helper_once_it_has_replied(model_dir):
    """A command's only job (`Translator.final`): the helper decodes its share, replies, lets go of its packages and
    ends by itself (the command's close waited ~0.02 s for that), where after any other job it waits for the next;
    the Translator's next job then starts a new helper, and every job gets the in-process lines."""
    import time

    expected = Translator.load(model_dir).translate(LINES)
    there = Translator.load(model_dir)
    there.batch_size, there.workers = 1, 2
    helpers = _started_helper(model_dir)
    there.use_workers(helpers)
    decode = there.decode_batches                                               # this process slow: the helper
    there.decode_batches = lambda batches, *a, **kw: decode((time.sleep(0.3) or b for b in batches), *a, **kw)
    try:
        assert there.translate(LINES) == expected and helpers.taken()[0] >= 1
        helpers.processes[0].join(timeout=2)
        assert helpers.processes[0].is_alive()                                  # waits for a next job
        there.final = True
        assert there.translate(LINES) == expected and helpers.taken()[0] >= 1
        helpers.processes[0].join(timeout=60)
        assert not helpers.processes[0].is_alive() and helpers.processes[0].exitcode == 0     # before any close
        assert helpers.analyse(["你好"] * 4) is None                           # nothing more is asked of it
        there.final = False
        assert there.translate(LINES) == expected and there._workers is not helpers
    finally:
        there.close()


@pytest.mark.slow
def test_a_long_jobs_later_lines_are_segmented_by_a_ready_helper_too(model_dir, monkeypatch):
    """From SHARED_ANALYSIS lines, with a helper started, the helper segments the later half while this process
    segments the first, then the later lines CHUNK at a time until the helper's ids are there: the ids are those of
    this process alone whether the answer comes before this process reaches the later half, in its middle, or never
    (a helper still starting; fewer lines are segmented here when it comes); an over-long line is refused first,
    named by its line, as without a helper."""
    import time

    from glassformer.decoding.workers import Workers

    monkeypatch.setattr(translator_module, "SHARED_ANALYSIS", 8)
    monkeypatch.setattr(translator_module, "CHUNK", 3)
    texts = [f"{line}{n}" for n, line in enumerate(LINES * 4)]                 # 44 lines, each other
    here = Translator.load(model_dir)
    expected = here.check_lengths(here.analyse(texts))
    there = Translator.load(model_dir)
    calls, analyse, pause = [], there.source.analyse, [0.05]
    monkeypatch.setattr(there.source, "analyse",
                        lambda text, *a: calls.append(text) or time.sleep(pause[0]) or analyse(text, *a))
    helpers = _started_helper(model_dir)
    there.use_workers(helpers)

    def answered_at(late: int):
        """`helpers.analysed`, None at the later half's first `late` looks, then the answer (waited for)."""
        looks = []

        def analysed(number):
            looks.append(number)
            for _ in range(0 if len(looks) <= late else 1200):
                if (ids := Workers.analysed(helpers, number)) is not None:
                    return ids
                time.sleep(0.05)
            return None
        return analysed

    try:
        assert there._source_ids(texts, False) == expected and len(calls) < len(texts)   # the answer: first
        pause[0] = 0
        for late in (1, 2, 4):
            monkeypatch.setattr(helpers, "analysed", answered_at(late))
            calls.clear()
            assert there._source_ids(texts, False) == expected and len(calls) == 22 + 3 * late, late
        with pytest.raises(limits.LimitError, match="input line 30"):
            there._source_ids(texts[:29] + ["好" * (limits.MAX_LINE_CHARS + 1)] + texts[30:], False)
    finally:
        there.close()
    still = Translator.load(model_dir)
    still.use_workers(Workers(_never_starts, 2))
    try:
        assert still._source_ids(texts, False) == expected
    finally:
        still.close()


def test_a_helper_asked_to_segment_stops_once_its_command_went_on(model_dir, tmp_path):
    """`_analyse` (a helper's side of `Workers.analyse`): the ids of the lines, written beside them; a helper whose
    command sent its next message meanwhile (it segmented the lines itself) stops at its next look and answers no,
    rather than segment lines no one waits for before it takes its share of the job; one without a tokenizer, no."""
    import pickle

    from glassformer.decoding import workers

    helper = Translator.load(model_dir)
    texts = [f"{line}{n}" for n, line in enumerate(LINES * 20)]              # 220 lines: four looks
    path = tmp_path / "1.texts"
    path.write_bytes(pickle.dumps(texts))
    done, where = workers._analyse(helper, str(path), lambda: False)
    assert done and pickle.loads(Path(where).read_bytes()) == helper.check_lengths(helper.analyse(texts))
    calls, analyse = [], helper.source.analyse
    helper.source.analyse = lambda text, *a: calls.append(text) or analyse(text, *a)
    looks = []
    done, why = workers._analyse(helper, str(path), lambda: looks.append(0) or len(looks) > 2)
    assert not done and len(looks) == 3 and len(calls) == 2 * workers.LOOK_EVERY, why
    helper.source = None
    assert workers._analyse(helper, str(path), lambda: False)[0] is False


def test_a_batchs_cost_counts_work_beside_its_source_length():
    """Short batches cost more per row and position than long ones (their steps, their start and end): a job of
    many short batches and one long one is not dealt by rows x longest alone."""
    from glassformer.decoding.workers import cost

    short, long = [[5] * 4] * 32, [[5] * 62] * 31                       # 32 x 4 tokens; 31 x 62 tokens
    assert cost(short) / (32 * 4) > cost(long) / (31 * 62) > 1.0
    assert cost(short + [[5] * 4]) > cost(short) and cost([[5] * 5] * 32) > cost(short)
    assert cost([]) == 0


def test_workers_give_each_sentence_its_in_process_translation(model_dir, monkeypatch):
    """--workers 2 in-process: this process and one helper take the batches; the first job ends before the helper
    has started (this process alone); once it has, a job where this process is slow is shared, and the helper's
    late answer to the first job (it took nothing) is not taken for the second's."""
    import time

    lines = ["我很好。", "你叫什么名字？", "谢谢你！", "我们明天去学校。", "他喜欢喝茶。", "这本书很好看。",
             "你好", "我昨天给了他一本书。", "", "今天天气很好，我们去公园吧。", "我不知道。"]
    here = Translator.load(model_dir)
    here.batch_size = 3
    expected = {beam: here.translate(lines, beam=beam) for beam in (1, 2)}
    notes = []
    there = Translator.load(model_dir)
    there.batch_size, there.workers, there.notes = 3, 2, notes.append
    try:
        assert there.translate(lines, beam=1) == expected[1]
        helpers = there._workers
        assert helpers.taken() == [0]                                               # still starting
        pid = helpers.processes[0].pid
        assert pid != os.getpid() and helpers.processes[0].is_alive()
        for _ in range(600):
            if helpers.started() == [True]:
                break
            time.sleep(0.1)
        decode = there.decode_batches                                               # this process: slow
        monkeypatch.setattr(there, "decode_batches",
                            lambda batches, *a, **kw: decode((time.sleep(0.5) or b for b in batches), *a, **kw))
        for beam in (2, 1):
            assert there.translate(lines, beam=beam) == expected[beam]
            assert helpers.taken()[0] >= 1                                          # the helper decoded some
        assert there._workers is helpers and helpers.processes[0].pid == pid        # the same process again
        assert notes == ["decoding in 2 processes (this one and 1 more)"]
        helpers.processes[0].kill()                                                 # a helper that ends
        helpers.processes[0].join()
        assert there.translate(lines, beam=1) == expected[1]                        # decoded here instead
        assert len(notes) == 2 and notes[1].startswith("--workers 2: RuntimeError") and notes[1].endswith("here")
        assert there._workers is None
    finally:
        there.close()


def test_workers_over_the_usable_cores_are_one_line_exit_2(model_dir, capsys, monkeypatch):
    from glassformer.threads import usable_cores

    code, out, err = _run(capsys, monkeypatch, ["translate", "--model", str(model_dir), "--workers",
                                                str(usable_cores() + 1), "你好"])
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "--workers" in err and "Traceback" not in err


def test_translate_with_workers_prints_the_same_lines(model_dir, capsys, monkeypatch):
    lines = ["我很好。", "你叫什么名字？", "谢谢你！", "我们明天去学校。", "他喜欢喝茶。"]
    code, alone, _ = _run(capsys, monkeypatch, ["translate", "--model", str(model_dir), "--batch-size", "2", *lines])
    code2, together, err = _run(capsys, monkeypatch, ["translate", "--model", str(model_dir), "--batch-size", "2",
                                                      "--workers", "2", *lines])
    assert code == code2 == 0 and together == alone and len(alone.splitlines()) == 5
    assert "decoding in 2 processes (this one and 1 more)" in err             # a helper was started


def test_workers_auto_counts_a_process_for_every_eight_batches_within_the_cores():
    from glassformer.decoding.commands import auto_workers

    assert auto_workers(15 * 64, 64, 2) == 1                 # 15 batches: the command's process alone
    assert auto_workers(15 * 64 + 1, 64, 2) == 2             # 16 batches (the last one sentence): two processes
    assert auto_workers(5120, 32, 2) == 2 and auto_workers(5120, 32, 3) == 3
    assert auto_workers(5120, 32, 64) == 8                   # at most 8, whatever the cores
    assert auto_workers(5120, 32, 1) == 1 and auto_workers(1, 64, 16) == 1 and auto_workers(0, 64, 16) == 1


def test_workers_auto_keeps_a_process_that_ran_torch_or_another_device_to_itself(model_dir):
    """In a process that imported torch (a test, a notebook) helpers would be spawned, a second or more each: auto
    starts none there, nor for another device; a count asked for is still checked against the cores."""
    from glassformer.decoding.commands import _workers
    from glassformer.threads import usable_cores

    job = argparse.Namespace(workers="auto", device="cpu", batch_size=1)
    assert "torch" in sys.modules and _workers(job, 10_000) == 1
    assert _workers(argparse.Namespace(workers="auto", device="cuda", batch_size=1), 10_000) == 1
    assert _workers(argparse.Namespace(workers=1, device="cpu"), 10_000) == 1
    with pytest.raises(UsageError, match="--workers"):
        _workers(argparse.Namespace(workers=usable_cores() + 1, device="cpu"), 10_000)


def test_a_long_job_is_decoded_beside_helpers_by_default(model_dir):
    """The command, by default (--workers auto), decodes a job of 16 batches in two processes where it may use two
    cores (a process for every 8 batches), the lines of one process; 15 batches: one."""
    from glassformer.threads import usable_cores

    command = [sys.executable, "-m", "glassformer.cli", "translate", "--model", str(model_dir), "--batch-size", "1"]
    lines = ["我很好。", "你叫什么名字？", "谢谢你！", "我们明天去学校。"] * 4
    text = "".join(f"{line}\n" for line in lines)
    auto = subprocess.run(command, input=text, capture_output=True, text=True, timeout=300)
    alone = subprocess.run([*command, "--workers", "1"], input=text, capture_output=True, text=True, timeout=300)
    short = subprocess.run(command, input=text[: text.rindex("我")], capture_output=True, text=True, timeout=300)
    assert auto.returncode == alone.returncode == short.returncode == 0, auto.stderr[-2000:]
    assert auto.stdout == alone.stdout and len(alone.stdout.splitlines()) == 16
    two = usable_cores() >= 2
    assert ("decoding in 2 processes" in auto.stderr) == two, auto.stderr
    assert "processes" not in alone.stderr and "processes" not in short.stderr, short.stderr


def test_without_a_compiler_the_command_and_its_helpers_say_so_once(model_dir, tmp_path):
    """--compile on --workers 2 where no C++ compiler is found: one line for the whole command (its helper makes the
    same decision and keeps quiet), and the eager lines."""
    lines = "".join(f"{line}\n" for line in ["我很好。", "你叫什么名字？", "谢谢你！", "我们明天去学校。"])
    command = [sys.executable, "-m", "glassformer.cli", "translate", "--model", str(model_dir), "--batch-size", "1"]
    env = {**os.environ, "PATH": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("CXX", None)
    eager = subprocess.run([*command, "--compile", "off"], input=lines, capture_output=True, text=True, env=env)
    done = subprocess.run([*command, "--compile", "on", "--workers", "2"], input=lines, capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout == eager.stdout and len(eager.stdout.splitlines()) == 4
    assert done.stderr.splitlines() == ["glassformer: decoding in 2 processes (this one and 1 more)",
                                        "glassformer: --compile on: no C++ compiler found (g++, clang++ or $CXX); "
                                        "decoding eagerly"], done.stderr


def test_the_command_starts_its_helpers_before_it_loads_the_model(model_dir, tmp_path):
    """translate --workers 2 starts its helper before this process loads the model (so both starts overlap): on Linux
    forked once torch is imported and before it ran (the helper imports nothing again), elsewhere spawned before
    torch loads; once the job is done and the command closes its pipe it ends by itself (a forked helper that kept
    our end of its pipe never heard the end, and was killed after 5 s); and loading a model does not import torch's
    compiler stack (a model built on the meta device did: 1.4 s of every start)."""
    code = ("import json, sys, time, multiprocessing.process as p\n"
            "import glassformer.decoding.workers as w\n"
            "seen, started, start, close = [], [], p.BaseProcess.start, w.Workers.close\n"
            "p.BaseProcess.start = lambda self: seen.append([type(self).__name__, 'torch' in sys.modules, "
            "'glassformer.decoding.translator' in sys.modules]) or started.append(self) or start(self)\n"
            "def closed(self):\n"                             # the command closes its helpers once the job is done:
            "    for _ in range(600):\n"                      # one still starting would be stopped there (killed)
            "        if self.started() == [True]: break\n"
            "        time.sleep(0.1)\n"
            "    close(self)\n"
            "w.Workers.close = closed\n"
            "from glassformer.cli import main\n"
            "code = main(['translate', '--model', sys.argv[1], '--batch-size', '1', '--workers', '2', '--compile', "
            "'off', '我很好。', '你好', '谢谢你！'])\n"
            "loaded = 'torch._dynamo' in sys.modules\n"
            "print(json.dumps([code, seen, loaded, [h.exitcode for h in started]]), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code, str(model_dir)], capture_output=True, text=True, timeout=300)
    fork = sys.platform.startswith("linux")
    expected = [0, [["ForkProcess", True, False] if fork else ["SpawnProcess", False, False]], False, [0]]
    assert json.loads(done.stderr.strip().splitlines()[-1]) == expected, done.stderr[-2000:]
    assert len(done.stdout.splitlines()) == 3


def test_the_command_loads_its_model_on_one_thread_beside_its_helper(model_dir, capsys, monkeypatch):
    """With a helper started (a core each) the command loads its model on its one thread: loaded on every core, its
    threads contended with the helper's own load (0.165 against 0.094 s, stamped in a 5,120-line job)."""
    threads, load = [], Translator.load.__func__
    monkeypatch.setattr(Translator, "load", classmethod(
        lambda cls, *a, **k: threads.append(torch.get_num_threads()) or load(cls, *a, **k)))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        code, out, _ = _run(capsys, monkeypatch, ["translate", "--model", str(model_dir), "--batch-size", "1",
                                                  "--workers", "2", "--compile", "off", *LINES[:4]])
    finally:
        torch.set_num_threads(before)
    assert code == 0 and len(out.splitlines()) == 4 and threads == [1], threads


def test_the_command_and_its_helper_keep_the_model_out_of_the_collectors_passes(model_dir):
    """A long job's allocations set off the interpreter's full collections, each of which walked every object torch
    and the model made (~0.1 s each, three a 5,120-sentence job): the command and its helper freeze them once the
    model is loaded, so no parameter of the model decoding a batch is among the objects a collection walks (as the
    console script runs it: a caller of `main`, a test, keeps its collector). The helper gets ready for the
    command's job (its beam, batch size and sentences) while it waits for it."""
    code = ("import gc, os, sys, time\n"
            "import glassformer.decoding.commands as c\n"                 # light: the helper is forked, as run
            "command, made, helper = os.getpid(), c._translator, c.helper_translator\n"
            "def watched(translator):\n"
            "    decode = translator.decode_batches\n"
            "    def seen(batches, *a, **k):\n"
            "        if os.getpid() == command:\n"                      # slowed: the helper takes batches too
            "            for _ in range(600):\n"                              # (once it has started)
            "                if translator._workers.started() == [True]: break\n"
            "                time.sleep(0.1)\n"
            "            batches = (time.sleep(0.3) or b for b in batches)\n"
            "        walked = {id(o) for o in gc.get_objects()}\n"
            "        hit = sum(id(p) in walked for p in translator.model.parameters())\n"
            "        params = len(list(translator.model.parameters()))\n"
            "        os.write(2, f'walked {os.getpid()} {hit} {params}\\n'.encode())\n"   # one write: lines whole
            "        return decode(batches, *a, **k)\n"
            "    translator.decode_batches = seen\n"
            "    return translator\n"
            "c._translator = lambda *a: (lambda t, alpha: (watched(t), alpha))(*made(*a))\n"
            "def helped(*a):\n"
            "    translator = watched(helper(*a))\n"
            "    translator.warm = lambda *job: os.write(2, f'warm {\" \".join(map(str, job))}\\n'.encode())\n"
            "    return translator\n"
            "c.helper_translator = helped\n"
            "from glassformer.cli import run\n"                              # the console script's entry
            "sys.argv = ['glassformer', 'translate', '--model', sys.argv[1], '--batch-size', '1', '--workers', '2', "
            "'--compile', 'off', *['我很好。', '你好', '谢谢你！'] * 8]\n"
            "run()\n")
    done = subprocess.run([sys.executable, "-c", code, str(model_dir)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 24, done.stderr[-2000:]
    walked = re.findall(r"walked (\d+) (\d+) (\d+)\n", done.stderr)          # (lines of two processes)
    assert len({pid for pid, *_ in walked}) == 2, done.stderr[-2000:]          # the command and its helper
    assert all(hit == "0" and int(params) > 10 for _, hit, params in walked), walked
    assert "warm 1 1 24\n" in done.stderr, done.stderr                  # the helper got ready for the job


def test_evaluate_forks_its_helpers_before_torch_runs(model_dir):
    """evaluate (interpret/evaluation.py's command, which wraps decoding's) builds its options and reads its split
    without torch, so its helpers are forked as translate's are (it imported torch at its module's top: --workers
    spawned them, a second import each, and auto never started one)."""
    code = ("import json, sys, multiprocessing.process as p\n"
            "seen, start = [], p.BaseProcess.start\n"
            "p.BaseProcess.start = lambda self: seen.append([type(self).__name__, 'torch' in sys.modules, "
            "'glassformer.decoding.translator' in sys.modules]) or start(self)\n"
            "from glassformer.cli import main\n"
            "code = main(['evaluate', '--model', sys.argv[1], '--split', 'dev', '--beam', '1', '--workers', '2', "
            "'--json'])\n"
            "print(json.dumps([code, seen]), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code, str(model_dir)], capture_output=True, text=True, timeout=300)
    fork = sys.platform.startswith("linux")
    expected = [0, [["ForkProcess", True, False] if fork else ["SpawnProcess", False, False]]]
    assert json.loads(done.stderr.strip().splitlines()[-1]) == expected, done.stderr[-2000:]
    assert json.loads(done.stdout)["sentences"] > 64                             # more than a batch: helpers


def test_a_caller_of_main_keeps_its_collector(model_dir, capsys, monkeypatch):
    """Only the console script's process is frozen (cli.run): a test or a notebook calling `main` keeps every object
    it makes collectable (a frozen object is never collected: a frozen Translator never let go of its packages)."""
    import gc

    frozen = gc.get_freeze_count()
    code, out, _ = _run(capsys, monkeypatch, ["translate", "--model", str(model_dir), "我很好。"])
    assert code == 0 and out.strip() and gc.get_freeze_count() == frozen


def test_workers_decode_at_the_translators_precision_and_refuse_a_converted_model(model_dir):
    """precision = "bfloat16": each worker converts its copy of the float32 model and prints what the process
    prints at that precision; a bfloat16 copy set as the model itself (unpicklable) is one note, decoded here."""
    from glassformer.inference.precision import with_precision

    lines = ["我很好。", "你叫什么名字？", "谢谢你！", "我们明天去学校。", "他喜欢喝茶。"]
    translator = Translator.load(model_dir)
    translator.model, translator.batch_size = with_precision(translator.model, "bfloat16"), 2
    expected = translator.translate(lines)
    notes = []
    translator.workers, translator.notes = 2, notes.append
    assert translator.translate(lines) == expected and translator._workers is None       # no process started
    assert notes == ["--workers 2: a float32 model (with `precision` to decode at another), not a bfloat16 copy; "
                     "decoding here"]
    at = Translator.load(model_dir)
    at.precision, at.batch_size = "bfloat16", 2
    here = at.translate(lines)
    at.workers, at.notes = 2, notes.append
    try:
        assert at.translate(lines) == here == expected and at._workers is not None
        assert at._workers.key[3] == "bfloat16" and notes[-1] == "decoding in 2 processes (this one and 1 more)"
    finally:
        at.close()


def test_workers_keep_the_commands_warnings_filters(model_dir, capfd):
    """--dtype int8 --workers 2: each worker makes its int8 copy (torch's deprecated quantisation, whose warnings the
    command filters); the workers take the command's filters, so stderr holds the command's one note, not theirs."""
    lines = ["我很好。", "你叫什么名字？", "谢谢你！", "我们明天去学校。"]
    code = main(["translate", "--model", str(model_dir), "--batch-size", "1", "--dtype", "int8", "--workers", "2",
                 *lines])
    out, err = capfd.readouterr()
    assert code == 0 and len(out.splitlines()) == 4
    assert err.strip().splitlines() == ["glassformer: decoding in 2 processes (this one and 1 more)"], err


@pytest.mark.xdist_group("model_dir_packages")
@pytest.mark.slow
def test_compiled_workers_leave_nothing_in_the_temporary_directory(model_dir, shared_packages, tmp_path):
    """A package's shared object runs from where it was taken out once beside the package (`paths.unpacked`), not
    from a folder torch's package loader made in the temporary directory at each load and removed only when the
    loader was freed (~10 MB a package and a process; a killed process, or workers terminated at the exit, left
    theirs): while a process and its compiled helper both hold their packages, the temporary directory is empty,
    and it stays empty after."""
    from glassformer.inference import compiler

    if compiler.cxx_compiler() is None:
        pytest.skip("needs a C++ compiler")
    temp = tmp_path / "tmp"
    temp.mkdir()
    code = ("import sys, os, time, torch; from glassformer.decoding.translator import Translator\n"
            "torch.set_num_threads(1)\n"
            "t = Translator.load(sys.argv[1]); t.batch_size, t.workers, t.compile, t.threads = 1, 2, 'on', 1\n"
            "t.compile_cache = sys.argv[2]; t.translate(sys.argv[3:])\n"           # the helper starts meanwhile
            "while not all(t._workers.started()): time.sleep(0.1)\n"
            "decode = t.decode_batches\n"                                         # this process slow: the helper
            "t.decode_batches = lambda b, *a, **k: decode((time.sleep(1) or x for x in b), *a, **k)\n"   # takes some
            "print(len(t.translate(sys.argv[3:])), t._workers.taken()[0] > 0)\n"
            "print(sum(p.startswith('aotinductor_') for p in os.listdir(os.environ['TMPDIR'])))\n")
    done = subprocess.run([sys.executable, "-c", code, str(model_dir), str(shared_packages), *SENTENCES, "你好"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "TMPDIR": str(temp)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["4 True", "0"]      # while both held them (2 packages each): nothing
    assert [p.name for p in temp.glob("aotinductor_*")] == []


@pytest.mark.xdist_group("model_dir_packages")
@pytest.mark.slow
def test_a_helper_gets_ready_for_its_job_with_what_was_built_and_builds_nothing(model_dir, shared_packages,
                                                                                 timed_gemms, tmp_path, monkeypatch):
    """`warm` (a helper's, while it waits for its job): with the packages built, the ones a batch and a sentence
    decode with are loaded then, and the job that follows loads none and prints the eager lines; where none was
    built, it traces, builds and loads nothing (the first batch that needs a package builds it); where a sentence's
    were built and a batch's not, it loads the sentence's only (a build there outlived a short job: the command
    waited for the helper, then stopped it, at every run)."""
    from glassformer.inference import compiler

    if compiler.cxx_compiler() is None:
        pytest.skip("needs a C++ compiler")
    ready = Translator.load(model_dir)
    ready.compile, ready.compile_cache, ready.threads, ready.batch_size = "on", str(shared_packages), 1, 1
    eager = Translator.load(model_dir).translate(SENTENCES)
    assert ready.translate(SENTENCES) == eager                                # built, or found, by the job itself
    loads, load = [], compiler._load
    monkeypatch.setattr(compiler, "_load", lambda path, packs: loads.append(path.name) or load(path, packs))
    helper = Translator.load(model_dir)
    helper.compile, helper.compile_cache, helper.threads, helper.batch_size = "on", str(shared_packages), 1, 1
    helper.warm(1, 1, len(SENTENCES))
    assert len(loads) == 2, loads                                             # the source side and the step
    assert helper.translate(SENTENCES) == eager and len(loads) == 2, loads    # nothing more at the job
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: pytest.fail("traced"))
    few = tmp_path / "few" / compiler.PACKAGES                                # a sentence's packages, not a batch's
    few.mkdir(parents=True)
    for path in (shared_packages / compiler.PACKAGES).glob("*-few-*"):
        shutil.copy(path, few / path.name)
    mixed = Translator.load(model_dir)
    mixed.compile, mixed.compile_cache, mixed.threads = "on", str(few.parent), 1
    mixed.warm(1, 8, len(SENTENCES))                         # the batch of 8 left to the job: nothing traced for it
    assert len(loads) == 4 and sorted(p.name for p in few.glob("*.pt2")) == sorted(loads[2:]), loads
    fresh = Translator.load(model_dir)
    fresh.compile, fresh.compile_cache, fresh.threads = "on", str(tmp_path / "none"), 1
    fresh.warm(1, 1, len(SENTENCES))
    assert len(loads) == 4 and not list((tmp_path / "none").rglob("*.pt2"))     # (the products' timing, at most)


@pytest.mark.xdist_group("model_dir_packages")
@pytest.mark.slow
def test_the_compiled_command_lets_go_of_its_packages_before_it_leaves(model_dir, shared_packages, tmp_path):
    """`translate --compile on` as the console script runs it (cli.run: its model's objects frozen out of the
    collector, then out without the interpreter's teardown): the command closes its Translator; while it held its
    two packages (the source side and the step, both loaded) nothing of them was in the temporary directory (the C++
    package loader's folders, two or three a run, ~10 MB each, were left when the frozen Translator was never
    freed); the lines are the eager ones, the status 0."""
    from glassformer.inference import compiler

    if compiler.cxx_compiler() is None or not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs a C++ compiler and CPU affinity")
    temp = tmp_path / "tmp"
    temp.mkdir()
    code = ("import os, sys\n"
            "import glassformer.decoding.translator as t\n"
            "import glassformer.inference.compiler as c\n"
            "close, load, loads = t.Translator.close, c._load, []\n"
            "c._load = lambda path, packs: loads.append(path) or load(path, packs)\n"
            "def counted(self):\n"
            "    held = sum(p.startswith('aotinductor_') for p in os.listdir(os.environ['TMPDIR']))\n"
            "    os.write(2, f'loaded {len(loads)} held {held}\\n'.encode())\n"
            "    close(self)\n"
            "t.Translator.close = counted\n"
            "from glassformer.cli import run\n"
            "sys.argv = ['glassformer', *sys.argv[1:]]\n"
            "run()\n")
    args = ["translate", "--model", str(model_dir), "--batch-size", "1", *SENTENCES]
    one_core = functools.partial(os.sched_setaffinity, 0, {min(os.sched_getaffinity(0))})   # the session's packages
    done = subprocess.run([sys.executable, "-c", code, *args, "--compile", "on", "--compile-cache",
                           str(shared_packages)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TMPDIR": str(temp)}, preexec_fn=one_core)
    eager = subprocess.run([sys.executable, "-m", "glassformer.cli", *args, "--compile", "off"], capture_output=True,
                           text=True, timeout=300)
    assert done.returncode == 0 and done.stdout == eager.stdout and len(eager.stdout.splitlines()) == 3, done.stderr
    assert "loaded 2 held 0" in done.stderr.splitlines(), done.stderr         # the source side and the step
    assert [p.name for p in temp.glob("aotinductor_*")] == []


def test_input_that_is_not_utf8_is_one_line_exit_2(model_dir):
    """A byte that is not UTF-8, on stdin or in an argument (Python keeps it as a lone surrogate), is refused in one
    line naming the input line and the byte, before anything is decoded (it was segmented as an unknown unit and
    "translated")."""
    command = [sys.executable, "-m", "glassformer.cli", "translate", "--model", str(model_dir)]
    piped = subprocess.run(command, input="我很好。\n".encode() + b"\xff\xfeabc\n", capture_output=True, timeout=300)
    argued = subprocess.run([*command, "你好", b"ab\xe4\xbd".decode("utf-8", "surrogateescape")],
                            capture_output=True, timeout=300)
    assert (piped.returncode, piped.stdout) == (2, b""), piped.stderr[-2000:]
    assert piped.stderr.decode().splitlines() == ["glassformer translate: error: input line 2 is not UTF-8 text "
                                                  "(byte 0xff)"]
    assert (argued.returncode, argued.stdout) == (2, b"")
    assert argued.stderr.decode().splitlines() == ["glassformer translate: error: input line 2 is not UTF-8 text "
                                                   "(byte 0xe4)"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_an_output_that_cannot_be_written_is_one_line_not_a_traceback(model_dir):
    """stdout on a full disk (/dev/full): one line saying so and status 1, as the console script runs it (a
    traceback before)."""
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "glassformer.cli", "translate", "--model", str(model_dir),
                               "我很好。"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert [line for line in lines if "No space left on device" in line] == lines[-1:], done.stderr
