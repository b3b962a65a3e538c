"""Hostile command-line arguments: each is one line on stderr naming the flag (and the limit), exit status 2, never a
traceback, and refused before the work it would have started (a float overflow, 20,000 threads, 21 GB of indent,
10 GB of segmenting, bytes that are not UTF-8 written out as JSON)."""

from __future__ import annotations

import errno
import io
import json
import os
import sys
from pathlib import Path

import pytest

from glassformer import limits
from glassformer.cli import main
from glassformer.data.tokenize import SourceTokenizer

DATA = Path(__file__).parent / "data"


def one_line_exit_2(capsys, argv, *words):
    """Run `glassformer argv` in this process: exit status 2 (argparse's own exit or the command's), stdout empty,
    stderr one line holding every word of `words`; returns that line."""
    try:
        code = main(argv)
    except SystemExit as stop:                                              # argparse's checks (types)
        code = stop.code
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    assert err.count("\n") == 1 and err.endswith("\n") and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)
    return err


# ---- --alpha: a finite number from 0 to MAX_ALPHA ----------------------------------------------------------

@pytest.mark.parametrize("command", ["translate", "evaluate"])
@pytest.mark.parametrize("value", ["1000", "nan", "inf", "-inf", "-1e308", "-0.5", "10.001", "1e999", "x", ""])
def test_alpha_outside_its_range_is_one_line_naming_the_limit(capsys, command, value):
    """--alpha 1000 --beam 4 was an OverflowError traceback (len ** alpha); nan, inf and negatives were taken."""
    one_line_exit_2(capsys, [command, "--model", "/nonexistent", "--beam", "4", f"--alpha={value}"],
                    "--alpha", "MAX_ALPHA", f"0 to {limits.MAX_ALPHA}")


def test_a_negative_count_of_examples_to_show_is_one_line(capsys):
    one_line_exit_2(capsys, ["evaluate", "--model", "/nonexistent", "--show", "-1"], "--show", ">= 0")


def test_alpha_at_the_ends_of_its_range_decodes(short_tiny_run, capsys):
    for value in ("0", str(limits.MAX_ALPHA)):
        code = main(["translate", "--model", str(short_tiny_run), "--beam", "4", "--alpha", value, "我很好。"])
        out, err = capsys.readouterr()
        assert code == 0 and len(out.splitlines()) == 1, err


# ---- free text that is not UTF-8 ---------------------------------------------------------------------------

# Python keeps a byte of argv that is not UTF-8 as a lone surrogate: $'\xff' arrives as '\udcff'
BAD = {"sentence": "\udcff\udcfe", "target": "I \udcff you", "love": "I love \udcff you", "word": "\udcff"}


@pytest.mark.parametrize("argv, flag", [
    (["explain", BAD["sentence"], "--json"], "argument sentence"),
    (["explain", "我", "--target", BAD["target"]], "argument --target"),
    (["attribute", "--target", BAD["target"]], "argument --target"),
    (["attribute", "--contrast", BAD["word"]], "argument --contrast"),
    (["attribute", BAD["sentence"]], "argument sentence"),
    (["patch", "--target", BAD["love"]], "argument --target"),
    (["patch", "--corrupt", BAD["word"]], "argument --corrupt"),
    (["patch", "--predict", BAD["word"]], "argument --predict"),
    (["patch", BAD["sentence"]], "argument clean"),
    (["align", BAD["sentence"], "--target", "I"], "argument sentence"),
    (["align", "我", "--target", BAD["target"]], "argument --target"),
])
def test_text_that_is_not_utf8_is_one_line_naming_the_argument(capsys, argv, flag):
    """Each was a traceback (UnicodeEncodeError) or, for `explain ... --json`, exit 0 with JSON that is not UTF-8."""
    line = one_line_exit_2(capsys, [*argv, "--model", "/nonexistent"], flag, "not UTF-8 text (byte 0xff)")
    line.encode("utf-8")                                                    # the message itself prints


def test_utf8_text_takes_any_text_that_encodes():
    from glassformer.cli import build_parser

    args = build_parser("patch").parse_args(["patch", "我／给／他", "--target", "I gave him 😀", "--predict", "him"])
    assert (args.clean, args.target, args.predict) == ("我／给／他", "I gave him 😀", "him")


# ---- train --threads: at most the usable cores -------------------------------------------------------------

def test_threads_over_the_usable_cores_is_one_line_before_the_run_starts(tmp_path, capsys):
    """--threads 9999 made 20,001 OS threads (only > 0 was checked)."""
    from glassformer.threads import usable_cores

    cores, out = usable_cores(), tmp_path / "run"
    one_line_exit_2(capsys, ["train", "--preset", "tiny", "--limit", "48", "--max-steps", "1", "--no-eval",
                             "--quiet", "--threads", str(cores + 1), "--out", str(out)],
                    f"--threads: {cores + 1}, outside 1..{cores}", "cores")
    assert not out.exists()


# ---- trace --indent and -o ---------------------------------------------------------------------------------

def test_trace_indent_over_its_limit_is_one_line(capsys):
    """--indent 100000000 allocated 21 GB (only < 0 was checked)."""
    one_line_exit_2(capsys, ["trace", str(DATA / "block.json"), "--indent", str(limits.MAX_JSON_INDENT + 1)],
                    "--indent", "MAX_JSON_INDENT")
    assert main(["trace", str(DATA / "block.json"), "--indent", str(limits.MAX_JSON_INDENT)]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["kind"] == "encoder_block" and out.startswith("{\n" + " " * limits.MAX_JSON_INDENT + '"')


class _FailsMidway:
    """A file open for writing that takes half of what is written, then fails as a file-size limit does (EFBIG)."""

    def __init__(self, real):
        self.real = real

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.real.close()

    def write(self, text):
        self.real.write(text[: len(text) // 2])
        self.real.flush()
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))


def _failing_writes(real_open):
    """`open`, but a file opened for writing fails midway (`_FailsMidway`)."""
    def opened(file, mode="r", *rest, **keywords):
        real = real_open(file, mode, *rest, **keywords)
        return _FailsMidway(real) if "w" in mode else real
    return opened


def test_trace_output_is_written_whole_or_not_at_all(tmp_path, capsys, monkeypatch):
    """-o wrote in place: a write that failed midway lost the earlier file and left a truncated one."""
    from glassformer.lesson import commands

    out = tmp_path / "out.json"
    out.write_text("the earlier trace\n")
    monkeypatch.setattr(commands, "open", _failing_writes(open), raising=False)
    try:
        code = main(["trace", str(DATA / "block.json"), "-o", str(out)])
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert code != 0 and err.splitlines() == [f"glassformer trace: error: -o {out}: {os.strerror(errno.EFBIG)}"]
    assert out.read_text() == "the earlier trace\n"                         # the earlier file as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]       # and no temporary one left
    monkeypatch.undo()
    assert main(["trace", str(DATA / "block.json"), "-o", str(out), "--indent", "2"]) == 0
    assert json.loads(out.read_text())["kind"] == "encoder_block"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_trace_output_that_cannot_be_made_is_one_line_naming_it(tmp_path, capsys):
    one_line_exit_2(capsys, ["trace", str(DATA / "block.json"), "-o", str(tmp_path / "no" / "out.json")],
                    f"-o {tmp_path / 'no' / 'out.json'}: No such file or directory")
    one_line_exit_2(capsys, ["trace", str(DATA / "block.json"), "-o", str(tmp_path)], f"-o {tmp_path}: Is a directory")
    assert list(tmp_path.iterdir()) == []


# ---- translate: one line's characters, checked before it is segmented --------------------------------------

def test_a_line_over_the_character_limit_is_refused_or_cut_before_it_is_segmented(short_tiny_run, capsys,
                                                                                    monkeypatch):
    """A 50M-character line was segmented whole (10.8 GB, 102 s) before the model's unit limit refused it; with
    --truncate the whole of it was segmented, then cut."""
    segmented = []
    analyse = SourceTokenizer.analyse

    def counted(self, text, *rest, **keywords):
        segmented.append(len(text))
        return analyse(self, text, *rest, **keywords)
    monkeypatch.setattr(SourceTokenizer, "analyse", counted)
    long_line = "我" * (limits.MAX_LINE_CHARS + 1)
    for verbose in ([], ["--verbose"]):
        monkeypatch.setattr(sys, "stdin", io.StringIO(f"你好。\n{long_line}\n"))
        one_line_exit_2(capsys, ["translate", "--model", str(short_tiny_run), *verbose], "input line 2",
                        f"{limits.MAX_LINE_CHARS + 1:,}", "MAX_LINE_CHARS", "--truncate")
        assert max(segmented, default=0) <= limits.MAX_LINE_CHARS
        monkeypatch.setattr(sys, "stdin", io.StringIO(f"你好。\n{long_line}\n"))
        code = main(["translate", "--model", str(short_tiny_run), "--truncate", *verbose])
        out, err = capsys.readouterr()
        assert code == 0 and len(out.splitlines()) == 2, err
        assert max(segmented) == limits.MAX_LINE_CHARS                      # cut to the limit, then segmented
        segmented.clear()


# ---- messages that say a thing once, and say the right thing ----------------------------------------------

def test_an_empty_model_name_is_named_as_such(capsys):
    one_line_exit_2(capsys, ["translate", "--model", "", "我很好。"], "--model: an empty folder name")


def test_an_empty_sentence_to_explain_is_one_line_said_once(short_tiny_run, capsys):
    err = one_line_exit_2(capsys, ["explain", "--model", str(short_tiny_run), " "], "the sentence is empty")
    assert err.count("explain") == 1, err


def test_weights_that_do_not_fit_name_their_file_once(short_tiny_run, tmp_path, capsys):
    import json
    import shutil

    run = tmp_path / "run"
    shutil.copytree(short_tiny_run, run)
    config = json.loads((run / "config.json").read_text(encoding="utf-8"))
    config["model"]["positions"] = "learned"                                # a table the weights do not hold
    (run / "config.json").write_text(json.dumps(config), encoding="utf-8")
    err = one_line_exit_2(capsys, ["translate", "--model", str(run), "我很好。"], "model.safetensors")
    assert err.count(str(run / "model.safetensors")) == 1, err


def test_too_many_corrupted_sentences_name_the_limit(short_tiny_run, capsys):
    argv = ["patch", "--model", str(short_tiny_run), "我很好。", *["--corrupt", "你很好。"] * 5]
    one_line_exit_2(capsys, argv, "corrupt", "MAX_CORRUPT")


@pytest.mark.parametrize("argv", [["import", "somewhere"], ["export", "--to", "transformers"],
                                  ["exercise", "new", "--kind", "attention"]])
def test_an_empty_out_is_refused_not_read_as_the_current_folder(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    one_line_exit_2(capsys, [*argv, "--out", ""], "--out", "an empty path")
    assert list(tmp_path.iterdir()) == []                                   # nothing written here
