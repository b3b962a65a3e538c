"""`glassformer translate / evaluate / explain` on a tiny trained model: one output line per input
line, length limits, missing models, the `gave` row of explain."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from glassformer.cli import main
from glassformer.translation.commands import add_train_arguments
from glassformer.translation.train import train

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
    assert 0.0 < focus["p"] < 1.0
    assert focus["token"] in [c["token"] for c in row["top"]] or focus["p"] <= row["top"][-1]["p"]
    for r in walk["rows"]:
        probs = [c["p"] for c in r["top"]]
        assert probs == sorted(probs, reverse=True) and sum(probs) <= 1.0 + 1e-6
        assert len(r["sees"]) == r["row"] + 1
        assert all(0.0 < h["weight"] <= 1.0 and h["unit"] in walk["units"] for h in r["cross_attention"])
    code, text, _ = _run(capsys, monkeypatch, ["explain", "我昨天给了他一本书。", "--model", str(model_dir)])
    assert code == 0 and "row 0: sees <s>" in text


@pytest.mark.slow
def test_evaluate_prints_bleu_and_chrf_with_signatures(model_dir, capsys, monkeypatch):
    code, out, _ = _run(capsys, monkeypatch, ["evaluate", "--model", str(model_dir), "--split", "dev",
                                              "--input", "gold", "--json"])
    assert code == 0
    result = json.loads(out)
    assert result["sentences"] == 232 and 0.0 <= result["bleu"] <= 100.0 and 0.0 <= result["chrf"] <= 100.0
    assert "nrefs:1" in result["bleu_signature"] and "nc:6" in result["chrf_signature"]
    assert result["beam"] == 4 and result["alpha"] == 1.0          # scores are reported with beam 4 (docs)


def test_explain_of_a_greedy_output_cut_at_the_limit_ends_without_eos(model_dir, capsys, monkeypatch):
    import glassformer.translation.explain as explain_module
    from glassformer.translation.decode import output_limits

    def cut_greedy(model, src, *args, **kw):                 # as if the model never chose EOS
        limit = int(output_limits(src == model.cfg.pad_id, model.cfg.max_len)[0])
        return [[7] * limit]
    monkeypatch.setattr(explain_module, "greedy", cut_greedy)
    code, out, _ = _run(capsys, monkeypatch, ["explain", "我很好。", "--model", str(model_dir), "--json"])
    assert code == 0
    walk = json.loads(out)
    assert walk["finished"] is False
    last = walk["rows"][-1]
    assert last["next"] != "</s>" and last["rank"] == 1 and last["next"] == last["top"][0]["token"]
    code, text, _ = _run(capsys, monkeypatch, ["explain", "我很好。", "--model", str(model_dir)])
    assert code == 0 and "cut at the length limit" in text


def _known_units(model_dir, n):
    from glassformer.translation.decode import Translator

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


@pytest.mark.parametrize("case", ["unknown", "counts", "predict", "too-many", "empty"])
def test_patch_bad_input_is_one_line_exit_2(model_dir, capsys, monkeypatch, case):
    a, b, c = _known_units(model_dir, 3)
    clean = f"{a}／{b}／{c}"
    argv, expected = {
        "unknown": ([clean, "--corrupt", f"{a}／龘／{c}"], "unknown unit '龘'"),
        "counts": ([clean, "--corrupt", f"{a}／{b}"], "patching positions needs the same count"),
        "predict": ([clean, "--corrupt", f"{a}／{c}／{c}", "--predict", "zebra"], "'zebra' is not a word"),
        "too-many": ([clean, *["--corrupt", clean] * 5], "the limit is 4"),
        "empty": (["  ", "--corrupt", clean], "clean: expected a non-empty"),
    }[case]
    code, out, err = _run(capsys, monkeypatch, ["patch", *argv, "--model", str(model_dir)])
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in err
