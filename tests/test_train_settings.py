"""`glassformer train` settings: typed, checked, one line per bad option, and what resume keeps."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from glassformer.cli import main
from glassformer.translation.settings import Preset, TrainSettings, check_settings
from glassformer.translation.train import RECIPES

TINY = ["train", "--preset", "tiny", "--limit", "48", "--max-tokens", "128", "--quiet", "--threads", "1"]


def one_line_exit_2(argv, capsys, *words):
    try:
        code = main(argv)
    except SystemExit as stop:                         # argparse's own checks (types, choices)
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)
    return err


def test_every_preset_is_a_typed_choice():
    assert set(typing.get_args(Preset)) == set(RECIPES)


def test_out_naming_a_file_or_a_path_under_a_file(tmp_path, capsys):
    file = tmp_path / "notes.txt"
    file.write_text("x")
    one_line_exit_2([*TINY, "--out", str(file)], capsys, "--out", "is a file")
    one_line_exit_2([*TINY, "--out", str(file / "run")], capsys, "--out", "under", "notes.txt")
    assert file.read_text() == "x"


def test_resume_of_nothing_says_so(tmp_path, capsys):
    new = tmp_path / "new"
    one_line_exit_2([*TINY, "--out", str(new), "--resume"], capsys, "nothing to resume")
    assert not (new / "config.json").exists()


@pytest.mark.parametrize("option, value, words", [
    ("--keep", "-1", ["--keep", ">= 0"]),
    ("--lr-factor", "-1", ["--lr-factor", "greater than 0"]),
    ("--label-smoothing", "1.5", ["--label-smoothing", "less than 1"]),
    ("--dropout", "1.0", ["--dropout", "less than 1"]),
    ("--source-units", "both", ["--source-units"]),
    ("--preset", "huge", ["--preset", "huge"]),
    ("--source-pieces", "999999999", ["--source-pieces", "262144"]),
    ("--bpe-vocab", "999999999", ["--bpe-vocab", "262144"]),
    ("--source-pieces", "50", ["--source-pieces", "distinct characters"]),
])
def test_bad_options_are_one_line(tmp_path, capsys, option, value, words):
    one_line_exit_2([*TINY, "--out", str(tmp_path / "run"), option, value], capsys, *words)
    assert not (tmp_path / "run" / "config.json").exists()


def test_saved_settings_are_checked_on_resume(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*TINY, "--out", str(run), "--max-steps", "1", "--no-eval"]) == 0
    capsys.readouterr()
    config = json.loads((run / "config.json").read_text())
    config["train"]["epochs"] = "many"
    (run / "config.json").write_text(json.dumps(config))
    one_line_exit_2([*TINY, "--out", str(run), "--resume"], capsys, "config.json", "epochs", "integer")
    config["train"]["epochs"] = 1
    config["train"]["colour"] = "red"
    (run / "config.json").write_text(json.dumps(config))
    one_line_exit_2([*TINY, "--out", str(run), "--resume"], capsys, "config.json", "colour", "unknown key")


def _records(run: Path, kind: str) -> list[dict]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in lines if r["kind"] == kind]


def test_no_eval_and_log_every_are_kept_on_resume(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*TINY, "--out", str(run), "--epochs", "1", "--no-eval", "--log-every", "3"]) == 0
    first = _records(run, "step")
    assert main([*TINY, "--out", str(run), "--resume", "--epochs", "2"]) == 0     # neither flag given again
    capsys.readouterr()
    resumed = _records(run, "step")[len(first):]
    epochs = _records(run, "epoch")
    assert resumed and all(r["step"] % 3 == 0 for r in resumed[:-1])               # every 3rd step (and the last)
    assert len(epochs) == 2 and not any("dev_bleu" in r for r in epochs)           # still no dev evaluation
    saved = json.loads((run / "config.json").read_text())["train"]
    assert saved["eval"] is False and saved["log_every"] == 3


def test_settings_round_trip_and_replace():
    settings = check_settings({"preset": "tiny", "model": dict(RECIPES["tiny"].model), "epochs": 1, "max_tokens": 64,
                               "lr_factor": 1.0, "warmup": 5, "label_smoothing": 0.1, "bpe_vocab": 300,
                               "glosses": False, "source_units": "raw", "average": 1, "char_fallback": False,
                               "dropout": 0.0})
    assert isinstance(settings, TrainSettings) and settings.seed == 1 and settings.eval is True
    assert check_settings(settings.to_dict()) == settings
    assert settings.replace(epochs=3).epochs == 3
    with pytest.raises(ValueError, match="--epochs"):
        settings.replace(epochs=0)
    with pytest.raises(ValueError, match="--glosses"):
        settings.replace(glosses=1)                     # no coercion: 1 is not true


def test_every_recipe_is_a_preset_the_settings_accept():
    import typing

    from glassformer.translation.settings import Preset
    from glassformer.translation.train import RECIPES

    assert set(typing.get_args(Preset)) == set(RECIPES)


def test_data_source_switches_reach_the_saved_settings(tmp_path, capsys):
    """--no-tatoeba / --hsk-repeat override the preset (the recipe table's ablations use them)."""
    from glassformer.cli import build_parser
    from glassformer.translation.settings import resolve_settings

    parser = build_parser()
    args = parser.parse_args(["train", "--preset", "default", "--no-tatoeba", "--hsk-repeat", "2", "--no-glosses"])
    settings = resolve_settings(args)
    assert (settings.tatoeba, settings.hsk_repeat, settings.glosses) == (False, 2, False)
    default = resolve_settings(parser.parse_args(["train", "--preset", "default"]))
    assert (default.tatoeba, default.hsk_repeat) == (RECIPES["default"].tatoeba, RECIPES["default"].hsk_repeat)
    one_line_exit_2([*TINY, "--out", str(tmp_path / "run"), "--hsk-repeat", "0"], capsys, "--hsk-repeat")


def test_the_time_estimate_is_seconds_per_step_times_steps_left(monkeypatch):
    """Measured over steps 11-60 of this invocation: 0.25 s per step, 940 steps left -> about 4 min."""
    from glassformer.translation import train as train_module

    now = [0.0]
    monkeypatch.setattr(train_module.time, "perf_counter", lambda: now[0])

    def run(estimate, steps):
        for step in steps:
            now[0] = step * 0.25                                 # a step takes 0.25 s
            yield estimate.update(step)

    estimate = train_module.Estimate(start_step=0, total_steps=1000)
    lines = [line for line in run(estimate, range(1, 200)) if line]
    assert len(lines) == 1                                   # printed once
    assert "250 ms per step" in lines[0] and "940 steps left" in lines[0] and "about 4 min" in lines[0]
    resumed = train_module.Estimate(start_step=500, total_steps=1000)
    assert not any(run(resumed, range(501, 560)))            # counts from where this invocation began
    assert "440 steps left" in next(line for line in run(resumed, range(560, 600)) if line)
