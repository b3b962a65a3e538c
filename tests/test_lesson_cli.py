"""`glassformer trace`, `lesson` and `verify` as a user runs them: output, exit status, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from glassformer.cli import main
from glassformer.lesson.examples import block_spec

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"


def glassformer(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "glassformer.cli", *args], input=stdin, capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


@pytest.mark.slow
def test_trace_prints_the_blocks_first_row():
    run = glassformer("trace", "tests/data/block.json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert [round(v, 6) for v in out["output"][0]] == [1.233154, 0.588798, -0.424732, -1.397220]
    assert [round(v, 6) for v in out["self_attention"]["heads"][0]["output"][0]] == [0.401112, 0.796664]


@pytest.mark.slow
def test_bad_spec_exits_2_with_one_line_and_no_traceback(tmp_path):
    bad = block_spec()
    bad["self_attention"]["heads"][1]["w_k"] = [[0.0] * 3] * 4
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    run = glassformer("trace", str(path))
    assert run.returncode == 2 and run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr
    assert "self_attention.heads[1].w_k: expected 4×2 (d×d_k), got 4×3" in lines[0]


@pytest.mark.slow
def test_trace_reads_stdin_and_writes_a_file(tmp_path, capsys):
    out = tmp_path / "trace.json"
    run = glassformer("trace", "-", "--output", str(out), "--indent", "2",
                      stdin=(DATA / "decoder_block.json").read_text())
    assert run.returncode == 0, run.stderr
    text = out.read_text()
    assert text.startswith("{\n  ") and json.loads(text)["kind"] == "decoder_block"


BAD_DOCS = {
    "not-an-object": ("[1, 2]", "spec: expected a JSON object"),
    "invalid-json": ('{"version": 1,', "invalid JSON at line 1"),
    "missing-key": (json.dumps({k: v for k, v in block_spec().items() if k != "ffn"}), "ffn: missing required key"),
    "unknown-key": (json.dumps({**block_spec(), "dropout": 0.1}), "dropout: unknown key"),
    "version": (json.dumps({**block_spec(), "version": 2}), "version: expected 1, got 2"),
    "kind": (json.dumps({**block_spec(), "kind": "block"}), "kind: expected one of"),
    "norm": (json.dumps({**block_spec(), "norm": "sandwich"}), "norm: expected"),
    "mask-word": (json.dumps({**block_spec(), "mask": "future"}), "mask: expected"),
    "activation": (json.dumps({**block_spec(), "ffn": {**block_spec()["ffn"], "activation": "tanh"}}),
                   "ffn.activation: expected 'relu', got a string ('tanh')"),
    "negative-eps": (json.dumps({**block_spec(), "eps": -1}), "eps: must not be negative"),
    "no-rows": (json.dumps({**block_spec(), "x": []}), "x: empty"),
    "no-heads": (json.dumps({**block_spec(), "self_attention": {"heads": [], "w_o": [[1.0]]}}),
                 "self_attention.heads: empty"),
    "shape": (json.dumps({**block_spec(), "mask": [[True, False]]}), "mask: expected 3×3 (n×m)"),
    "nan": (json.dumps(block_spec()).replace("1e-05", "NaN"), "eps: non-finite number nan"),
    "infinity": (json.dumps(block_spec()).replace("[1.0, 0.0, 1.0, 0.0]", "[1.0, Infinity, 1.0, 0.0]", 1),
                 "x[0][1]: non-finite"),
    "bool-number": (json.dumps({**block_spec(), "eps": True}), "eps: expected a number, got a boolean"),
    "head-range": (json.dumps({**block_spec(), "disabled_heads": [5]}), "disabled_heads[0]: head 5 out of range"),
    # counted before the schema builds a cell (which made a problem per bad cell: 1.6 GB for a 4 MB file)
    "cells": (json.dumps({**block_spec(), "x": [[{}] * 70_000]}),
              "x: number of elements is 70,000; the limit is 65,536 (MAX_MATRIX_ELEMENTS)"),
    "rows": (json.dumps({**block_spec(), "x": [[1.0]] * 70_000}), "x: number of elements is 70,000"),
    "heads": (json.dumps({**block_spec(), "self_attention": {**block_spec()["self_attention"],
                                                             "heads": [{}] * 33}}),
              "self_attention.heads: number of heads is 33; the limit is 32 (MAX_SPEC_HEADS)"),
}


@pytest.mark.parametrize("name", BAD_DOCS)
def test_every_error_class_is_one_line_exit_2(name, tmp_path, capsys):
    text, expected = BAD_DOCS[name]
    path = tmp_path / f"{name}.json"
    path.write_text(text)
    assert main(["trace", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert "\n" not in err and expected in err and err.startswith("glassformer trace: error: ")


def test_a_fifo_no_one_writes_to_is_one_line_not_a_wait(tmp_path, capsys):
    import os

    fifo = tmp_path / "spec.json"
    os.mkfifo(fifo)
    assert main(["trace", str(fifo)]) == 2                                  # it waited for a writer before
    assert "empty; expected a JSON document" in capsys.readouterr().err


def test_a_file_over_the_limit_is_named_by_its_size(tmp_path, capsys):
    path = tmp_path / "big.json"
    path.write_text(" " * 9_000_058)
    assert main(["trace", str(path)]) == 2
    assert "size in bytes is 9,000,058; the limit is 4,194,304 (MAX_SPEC_FILE_BYTES)" in capsys.readouterr().err


def test_missing_file_exits_2(capsys):
    assert main(["trace", "tests/data/no-such-spec.json"]) == 2
    assert "no-such-spec.json" in capsys.readouterr().err


def test_negative_indent_exits_2(capsys):
    assert main(["trace", str(DATA / "block.json"), "--indent", "-1"]) == 2
    assert "--indent" in capsys.readouterr().err


@pytest.mark.slow
def test_verify_exits_0_and_lists_every_id():
    run = glassformer("verify")
    assert run.returncode == 0, run.stdout + run.stderr
    ids = [line.split()[0] for line in run.stdout.splitlines()[:-1]]
    expected = ([f"A{i}" for i in range(1, 8)] + [f"B{i}" for i in range(1, 9)] + [f"C{i}" for i in range(1, 7)]
                + [f"D{i}" for i in range(1, 8)] + [f"E{i}" for i in range(1, 5)] + ["F1", "G1", "G2"])
    assert ids == expected
    assert all(" PASS " in line for line in run.stdout.splitlines()[:-1])
    assert run.stdout.splitlines()[-1] == "35 claims: 35 PASS, 0 FAIL"


def test_verify_selected_ids_json(capsys):
    assert main(["verify", "a5", "B3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [c["id"] for c in out["claims"]] == ["A5", "B3"] and out["failed"] == []
    assert "1.233154" in out["claims"][1]["measured"]
    b3 = out["claims"][1]
    assert [round(v, 6) for v in b3["values"]["z"]] == [1.233154, 0.588798, -0.424732, -1.39722]
    assert b3["values"]["lesson"] <= b3["tolerance"]["lesson"] == 5e-7 and b3["passed"] is True


def test_verify_exits_1_when_a_claim_fails(monkeypatch, capsys):
    from glassformer.lesson import claims
    monkeypatch.setitem(claims.CHECKS, "A5", ("the 2×3 exercise",
                                              lambda: claims.reading("weights off by {off}", False, off=0.1)))
    assert main(["verify", "A5", "A6"]) == 1
    out = capsys.readouterr().out
    assert "A5  FAIL" in out and "A6  PASS" in out and "1 FAIL (A5)" in out and "weights off by 0.1" in out


def test_verify_unknown_id_exits_2(capsys):
    assert main(["verify", "Z9"]) == 2
    assert "unknown claim ID 'Z9'" in capsys.readouterr().err


def test_lesson_json_has_the_exercise_numbers(capsys):
    assert main(["lesson", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    unscaled = out["exercise"]["unscaled"]
    assert [round(v, 6) for v in unscaled["weights"][0]] == [0.422319, 0.155362, 0.422319]
    assert [round(v, 6) for v in unscaled["output"][1]] == [0.733044, 2.533913]
    assert round(out["exercise"]["scaled"]["scaled_scores"][0][0], 6) == 0.707107
    assert [round(v, 6) for v in out["block"]["output"][0]] == [1.233154, 0.588798, -0.424732, -1.39722]
    assert len(out["nine_units"]["weights"][0]) == 9 and "untrained" in out["nine_units"]["model"]
    assert out["batch"]["loss_terms"] == [6, 3]
    assert sum(map(sum, out["batch"]["causal"])) == 21
    assert [sum(map(sum, m)) for m in out["batch"]["decoder_self"]] == [21, 18]
    assert out["batch"]["encoder_self"][1][0] == [True, True, False, False, False, False]
    assert out["batch"]["cross"][1][5] == [True, True, False, False, False, False]


def test_lesson_text_tables(capsys):
    assert main(["lesson"]) == 0
    text = capsys.readouterr().out
    for needle in ("0.422319", "0.707107", "1.233154  0.588798 -0.424732 -1.397220", "0.521116", "untrained",
                   "loss terms: A 6, B 3"):
        assert needle in text, needle
    header = next(line for line in text.splitlines() if "昨天" in line and "。" in line and "==" not in line)
    assert header.split() == ["我", "昨天", "给", "了", "他", "一", "本", "书", "。"]
