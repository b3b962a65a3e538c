"""`glassformer train` settings: typed, checked, one line per bad option, and what resume keeps."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from glassformer.cli import main
from glassformer.training.presets import PRESETS
from glassformer.training.settings import Preset, TrainSettings, check_settings, preset_settings

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
    assert set(typing.get_args(Preset)) == set(PRESETS)


# The full settings each preset stood for when every preset still listed every knob: a preset is now only
# what it changes of the schema defaults, and must still come to the same run.
MODEL_128 = dict(d_model=128, heads=4, d_ff=512, encoder_layers=2, decoder_layers=2, max_len=128,
                 norm_placement="post", attention_dropout=0.0)
EXTRAS = dict(glosses=True, char_fallback=True, source_units="raw")
BEFORE = {
    "tiny": dict(model=dict(d_model=32, heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0, max_len=64,
                            norm_placement="post", attention_dropout=0.0),
                 epochs=1, max_tokens=512, lr_factor=1.0, warmup=50, bpe_vocab=300, glosses=False, source_units="raw",
                 char_fallback=False, average=1, tatoeba=False, hsk_repeat=1),
    "anchor": dict(model=dict(MODEL_128, dropout=0.1), epochs=30, max_tokens=1024, lr_factor=0.5, warmup=400,
                   bpe_vocab=2000, glosses=False, char_fallback=False, source_units="gold", average=1, tatoeba=False,
                   hsk_repeat=1),
    "hsk": dict(model=dict(MODEL_128, dropout=0.3), epochs=40, max_tokens=1024, lr_factor=0.5, warmup=400,
                bpe_vocab=2000, **EXTRAS, average=5, tatoeba=False, hsk_repeat=1),
    "default": dict(model=dict(MODEL_128, d_model=192, d_ff=768, dropout=0.1), epochs=8, max_tokens=1024,
                    lr_factor=0.7, warmup=800, bpe_vocab=4000, **dict(EXTRAS, glosses=False), average=1, tatoeba=True,
                    hsk_repeat=3, cooldown=0.3),
    "large": dict(model=dict(MODEL_128, d_model=256, d_ff=1024, encoder_layers=3, decoder_layers=3, dropout=0.1),
                  epochs=12, max_tokens=2048, lr_factor=0.7, warmup=800, bpe_vocab=6000, **EXTRAS, average=3,
                  tatoeba=True, hsk_repeat=3),
}
COMMON = dict(label_smoothing=0.1, cooldown=0.0, word_dropout=0.0, bpe_dropout=0.0,
              source_pieces=0, hsk_finish=0, max_steps=None, seed=1, limit=None, accumulate=1,
              eval=True, log_every=10, dtype="float32")


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_each_preset_comes_to_the_settings_it_always_had(name):
    assert set(BEFORE) == set(PRESETS)
    assert preset_settings(name).to_dict() == {"preset": name, **COMMON, **BEFORE[name]}


def test_the_flags_are_the_schema_fields_with_their_help(capsys):
    from glassformer.cli import build_parser
    from glassformer.threads import usable_cores

    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--preset", "--out", "--epochs", "--max-steps", "--max-tokens", "--accumulate", "--lr-factor",
                 "--warmup", "--label-smoothing", "--dropout", "--d-model", "--d-ff", "--heads", "--layers", "--norm",
                 "--bpe-vocab", "--glosses, --no-glosses", "--char-fallback, --no-char-fallback",
                 "--tatoeba, --no-tatoeba", "--hsk-repeat", "--source-pieces", "--hsk-finish", "--source-units",
                 "--average", "--seed", "--resume", "--keep", "--device", "--threads", "--limit", "--log-every",
                 "--eval, --no-eval", "--quiet", "--dtype {float32,bfloat16}"):
        assert flag in text, flag
    assert "--max-len" not in text and "--encoder-layers" not in text and "--no-resume" not in text
    assert f"the {usable_cores()} usable cores here" in text and "default 2," not in text
    assert "Noam warm-up steps (default 800; tiny 50; anchor 400; hsk 400)" in text       # what each preset uses
    assert "add the Tatoeba training pairs (default on; tiny off; anchor off; hsk off)" in text


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
    ("--d-model", "99999", ["--d-model", "99,999", "MAX_D_MODEL"]),
    ("--layers", "100", ["--layers", "MAX_LAYERS"]),
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
    settings = check_settings({"preset": "tiny", "model": dict(PRESETS["tiny"]["model"]), "epochs": 1, "max_tokens": 64,
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


def test_data_source_switches_reach_the_saved_settings(tmp_path, capsys):
    """--no-tatoeba / --hsk-repeat override the preset (the recipe table's ablations use them)."""
    from glassformer.cli import build_parser
    from glassformer.training.settings import resolve_settings

    parser = build_parser()
    args = parser.parse_args(["train", "--preset", "default", "--no-tatoeba", "--hsk-repeat", "2", "--glosses"])
    settings = resolve_settings(args)
    assert (settings.tatoeba, settings.hsk_repeat, settings.glosses) == (False, 2, True)
    default = resolve_settings(parser.parse_args(["train", "--preset", "default"]))
    assert (default.tatoeba, default.hsk_repeat, default.glosses) == (True, 3, False)
    one_line_exit_2([*TINY, "--out", str(tmp_path / "run"), "--hsk-repeat", "0"], capsys, "--hsk-repeat")


def test_the_time_estimate_is_seconds_per_step_times_steps_left():
    """From the progress bar's numbers: 60 steps of this invocation (from step 500) in 15 s is 0.25 s per step;
    440 steps left -> 110 s, about 2 min."""
    from glassformer.training.loop import estimate_line

    line = estimate_line({"n": 560, "initial": 500, "total": 1000, "elapsed": 15.0, "rate": None})
    assert "250 ms per step" in line and "440 steps left" in line and "about 2 min" in line
    assert "940 steps left" in estimate_line({"n": 60, "initial": 0, "total": 1000, "elapsed": 6.0})


def _old_format(run: Path) -> None:
    """config.json's "train" as runs written before the one settings schema have it: the model's dropout also
    at the top level, no "dtype", no "norm_placement" in the model part."""
    config = json.loads((run / "config.json").read_text())
    train = config["train"]
    train.pop("dtype")
    train["model"].pop("norm_placement")
    train["dropout"] = train["model"]["dropout"]
    (run / "config.json").write_text(json.dumps(config))


def test_a_run_saved_in_the_earlier_format_resumes(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*TINY, "--out", str(run), "--max-steps", "2", "--no-eval", "--log-every", "1"]) == 0
    _old_format(run)
    assert main([*TINY, "--out", str(run), "--resume", "--max-steps", "4"]) == 0
    capsys.readouterr()
    state = json.loads((run / "state.json").read_text())
    saved = json.loads((run / "config.json").read_text())["train"]
    assert state["step"] == 4 and "dtype" not in saved                   # config.json is written once, at the start
    assert [r["step"] for r in _records(run, "step")] == [1, 2, 3, 4]


def test_resume_keeps_the_run_settings_and_refuses_a_different_one(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*TINY, "--out", str(run), "--max-steps", "1", "--no-eval", "--dtype", "bfloat16"]) == 0
    capsys.readouterr()
    assert json.loads((run / "config.json").read_text())["train"]["dtype"] == "bfloat16"
    one_line_exit_2([*TINY, "--out", str(run), "--resume", "--dtype", "float32"], capsys,
                    "--dtype", "'bfloat16'", "--resume keeps it", "--epochs")
    one_line_exit_2([*TINY, "--out", str(run), "--resume", "--layers", "3"], capsys, "--layers", "2")
    assert json.loads((run / "state.json").read_text())["step"] == 1
    trainer_settings = _resumed(run, "--max-steps", "2")                  # given again unchanged: fine
    assert trainer_settings.dtype == "bfloat16" and trainer_settings.max_steps == 2


def _resumed(run: Path, *extra: str) -> TrainSettings:
    from glassformer.cli import build_parser
    from glassformer.training.settings import resumed_settings

    args = build_parser().parse_args([*TINY, "--out", str(run), "--resume", "--dtype", "bfloat16", *extra])
    saved = json.loads((run / "config.json").read_text())["train"]
    return resumed_settings(saved, args, "config.json: train")
