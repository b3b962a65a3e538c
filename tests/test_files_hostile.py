"""Hostile files and failing writes, each one line and exit 2 (never a traceback, never a half-written output):
a gold link of 5,000 digits and a gold file without pairs (`align --gold`), `import` and `export` when the disk
refuses a write (a file-size limit: an OSError, or safetensors' own SafetensorError), `export --out` under a
folder that cannot be made, and `exercise check` on numbers that overflow float64 (no NumPy warning on stderr,
and no infinite product judged right)."""

from __future__ import annotations

import errno
import json
import warnings
from pathlib import Path

import pytest
import torch
from tests.marian_files import marian_tokenizer_files

from glassformer.cli import main
from glassformer.data.checkpoint import save_run_files, save_weights
from glassformer.data.tokenize import SourceTokenizer, TargetTokenizer
from glassformer.errors import UsageError
from glassformer.interpret.gold import load_gold
from glassformer.model import ModelConfig, Transformer

ZH = ["我很好。", "你好吗？", "他是学生。", "我们去学校。"]
EN = ["I am fine.", "How are you?", "He is a student.", "We go to school."]
GOLD = {"id": "x1", "split": "test", "zh": "我很好。", "en": "I am fine.", "src": ["我", "很", "好", "。"],
        "tgt": ["I", "am", "fine", "."], "sure": "0-0 2-2 3-3", "possible": "0-0 1-1 2-2 3-3"}


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """An untrained tiny model saved as an ordinary run folder (glassformer's own tokenizers)."""
    source = SourceTokenizer.train([list(z) for z in ZH])
    target = TargetTokenizer.train(EN, 120)
    cfg = ModelConfig.tiny(src_vocab=source.vocab_size, tgt_vocab=target.vocab_size)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("runs") / "tiny"
    save_run_files(out, cfg, {}, source, target)
    save_weights(Transformer(cfg).eval(), out / "model.safetensors")
    return out


def _gone(out: Path) -> None:
    """Neither the output nor its staging folder is left behind."""
    assert not out.exists(), sorted(out.iterdir())
    assert not list(out.parent.glob(f".{out.name}*")), list(out.parent.iterdir())


# ---- align --gold ----------------------------------------------------------------------------------
def test_a_link_of_5000_digits_is_one_line_naming_line_and_field(tmp_path, capsys):
    path = tmp_path / "gold.jsonl"
    path.write_text(json.dumps({**GOLD, "sure": "0-" + "9" * 5000, "possible": "0-" + "9" * 5000}) + "\n")
    with pytest.raises(UsageError) as info:
        load_gold(path)
    message = str(info.value)
    assert f"{path} line 1: field 'sure'" in message and "5000 digits" in message and "MAX_GOLD_TOKENS" in message
    assert len(message) < 300, message
    assert main(["align", "--gold", str(path), "--model", str(tmp_path / "no-model")]) == 2  # the gold file first
    err = _one_line(capsys)
    assert f"{path} line 1: field 'sure'" in err and "5000 digits" in err, err
    # leading zeros are no digits of the value: "0-000…01" is the link 0-1
    path.write_text(json.dumps({**GOLD, "sure": "0-" + "0" * 5000 + "1", "possible": "0-1 0-0 1-1 2-2 3-3"}) + "\n")
    assert load_gold(path)[0].sure == {(0, 1)}


@pytest.mark.parametrize("text", ["", "\n\n  \n\n"], ids=["empty", "blank lines"])
def test_a_gold_file_without_pairs_is_refused(run_dir, tmp_path, capsys, text):
    path = tmp_path / "gold.jsonl"
    path.write_text(text)
    with pytest.raises(UsageError, match="no gold pairs"):
        load_gold(path)
    assert main(["align", "--gold", str(path), "--model", str(run_dir)]) == 2
    err = _one_line(capsys)
    assert str(path) in err and "no gold pairs" in err, err
    assert capsys.readouterr().out == ""                                # no table scoring nothing as AER 0.000


# ---- export ---------------------------------------------------------------------------------------
def test_export_when_safetensors_cannot_write(run_dir, tmp_path, capsys, monkeypatch):
    from safetensors import SafetensorError

    from glassformer.interop import export

    def full_disk(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 100)                           # a part was written, then the limit
        raise SafetensorError("Error while serializing: I/O error: File too large (os error 27)")

    monkeypatch.setattr(export, "save_file", full_disk)
    out = tmp_path / "hf"
    assert main(["export", "--model", str(run_dir), "--to", "transformers", "--out", str(out)]) == 2
    err = _one_line(capsys)
    assert f"--out {out}: cannot write" in err and "File too large" in err, err
    _gone(out)
    monkeypatch.undo()
    assert main(["export", "--model", str(run_dir), "--to", "transformers", "--out", str(out)]) == 0
    assert (out / "model.safetensors").is_file() and (out / "source_tokenizer.json").is_file()


def test_export_when_a_json_file_cannot_be_written(run_dir, tmp_path, capsys, monkeypatch):
    from glassformer.interop import export

    def full_disk(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(export, "write_json", full_disk)
    out = tmp_path / "hf"
    assert main(["export", "--model", str(run_dir), "--to", "transformers", "--out", str(out)]) == 2
    err = _one_line(capsys)
    assert f"--out {out}: cannot write" in err and "No space left on device" in err, err
    _gone(out)


def test_export_out_where_no_folder_can_be_made_names_the_out_given(run_dir, tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    outs = [tmp_path / "afile" / "x"] + ([Path("/proc/glassformer-export-test")] if Path("/proc/self").exists()
                                         else [])
    for out in outs:
        assert main(["export", "--model", str(run_dir), "--to", "transformers", "--out", str(out)]) == 2
        err = _one_line(capsys)
        assert f"--out {out}: " in err and ".partial" not in err, err
        assert not out.exists()


# ---- import ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def marian_dir(run_dir, tmp_path_factory) -> Path:
    """A Marian folder: the tiny run exported to transformers, with the tokenizer files MarianTokenizer has."""
    pytest.importorskip("sentencepiece")
    from glassformer.data.checkpoint import load_translator_parts
    from glassformer.interop.export import export

    folder = tmp_path_factory.mktemp("marian") / "hf"
    export(run_dir, "transformers", folder)
    _, source, target, _ = load_translator_parts(run_dir)
    marian_tokenizer_files(folder, source, target)
    return folder


def test_import_when_the_weights_cannot_be_written(marian_dir, tmp_path, capsys, monkeypatch):
    """The audit's case: the copy is refused part-way; a rerun then finds --out free, not half-written."""
    from glassformer.interop import importer

    def too_large(model, path):
        Path(path).write_bytes(b"\0" * 100)
        raise OSError(errno.EFBIG, "File too large")

    monkeypatch.setattr(importer, "save_weights", too_large)
    out = tmp_path / "run"
    assert main(["import", str(marian_dir), "--out", str(out)]) == 2
    err = _one_line(capsys)
    assert f"--out {out}: cannot write the run folder (File too large)" in err, err
    _gone(out)
    monkeypatch.undo()
    assert main(["import", str(marian_dir), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "source.spm",
                                                     "target.spm", "vocab.json"]


def test_an_imported_num_beams_is_kept_only_where_translate_could_use_it(marian_dir, tmp_path, capsys):
    """generation_config.json's num_beams goes into origin when --beam would take it (1..MAX_BEAM), not -5 or true."""
    import shutil

    for value, kept in ((4, True), (-5, False), (True, False), (10_000, False)):
        folder = tmp_path / f"hf{value}"
        shutil.copytree(marian_dir, folder)
        (folder / "generation_config.json").write_text(json.dumps({"num_beams": value}))
        out = tmp_path / f"run{value}"
        assert main(["import", str(folder), "--out", str(out)]) == 0
        origin = json.loads((out / "config.json").read_text(encoding="utf-8"))["origin"]
        assert (origin.get("num_beams") == value) is kept and (kept or "num_beams" not in origin), origin


def test_import_when_a_copy_is_cut_names_the_output_not_the_source(marian_dir, tmp_path, capsys, monkeypatch):
    from glassformer.interop import importer

    def cut(src, dst, **kwargs):               # shutil.copyfile's sendfile: the error names both files, src first
        Path(dst).write_bytes(b"\0" * 10)
        raise OSError(errno.EFBIG, "File too large", str(src), None, str(dst))

    monkeypatch.setattr(importer.shutil, "copyfile", cut)
    out = tmp_path / "run"
    assert main(["import", str(marian_dir), "--out", str(out)]) == 2
    err = _one_line(capsys)
    assert f"--out {out}: cannot write the run folder (File too large)" in err and str(marian_dir) not in err, err
    _gone(out)

    def unreadable(src, dst, **kwargs):        # a source file that cannot be read is named as it is
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(src))

    monkeypatch.setattr(importer.shutil, "copyfile", unreadable)
    assert main(["import", str(marian_dir), "--out", str(out)]) == 2
    err = _one_line(capsys)
    assert f"{marian_dir / 'source.spm'}" in err and "--out" not in err, err
    _gone(out)


def test_a_folder_beside_out_named_like_a_staging_folder_is_left_alone(run_dir, marian_dir, tmp_path):
    """import and export stage in a folder of their own making: a user's `.NAME.partial` beside --out (or another
    run's) was removed before."""
    for command in (["import", str(marian_dir)], ["export", "--model", str(run_dir), "--to", "transformers"]):
        out = tmp_path / command[0]
        keep = tmp_path / f".{out.name}.partial"
        keep.mkdir()
        (keep / "precious.txt").write_text("mine")
        assert main([*command, "--out", str(out)]) == 0
        assert (keep / "precious.txt").read_text() == "mine"
        assert (out / "config.json").is_file() and oct(out.stat().st_mode & 0o777) != oct(0o700)
        assert sorted(p.name for p in tmp_path.glob(f".{out.name}*")) == [keep.name]      # nothing else left


def test_an_out_that_links_to_an_empty_folder_is_written_there(run_dir, tmp_path):
    """--out a symbolic link to an empty folder: the files go into that folder (the whole export was done, then
    the link could not be replaced: "Not a directory")."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    assert main(["export", "--model", str(run_dir), "--to", "transformers", "--out", str(tmp_path / "link")]) == 0
    assert (tmp_path / "link").is_symlink() and (tmp_path / "empty" / "model.safetensors").is_file()


def _edited_weights(marian_dir: Path, tmp_path: Path, edit) -> Path:
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "hostile"
    shutil.copytree(marian_dir, folder)
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors")
    return folder


@pytest.mark.parametrize("edit, expected", [
    (lambda t: t.update({"model.encoder.layers.7.fc1.weight": torch.zeros(2, 2)}),
     "model.encoder.layers.7.fc1.weight is not part of the Marian model"),
    (lambda t: t.update({"junk.weight": torch.zeros(3)}), "junk.weight is not part of"),
    (lambda t: t.update({"final_logits_bias": t["final_logits_bias"].to(torch.int64)}),
     "final_logits_bias is int64"),
])
def test_weights_config_json_does_not_describe_are_refused_not_dropped(marian_dir, tmp_path, capsys, edit, expected):
    folder = _edited_weights(marian_dir, tmp_path, edit)
    out = tmp_path / "run"
    assert main(["import", str(folder), "--out", str(out)]) == 2
    err = _one_line(capsys)
    assert expected in err, err
    _gone(out)


def test_fewer_layers_in_config_json_than_in_the_weights_is_refused(marian_dir, tmp_path, capsys):
    import shutil

    folder = tmp_path / "hostile"
    shutil.copytree(marian_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["encoder_layers"] >= 2
    config["encoder_layers"] = 1
    (folder / "config.json").write_text(json.dumps(config))
    assert main(["import", str(folder), "--out", str(tmp_path / "run")]) == 2
    assert "model.encoder.layers.1." in _one_line(capsys)


def test_a_pickle_asking_for_a_global_is_refused_naming_it(marian_dir, tmp_path, capsys):
    import os
    import pickle
    import shutil

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    folder = tmp_path / "hostile"
    shutil.copytree(marian_dir, folder)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"a": Evil()}, protocol=2))   # torch.save's
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert main(["import", str(folder), "--out", str(tmp_path / "run")]) == 2
    err = _one_line(capsys)
    assert "refused: not a weights-only PyTorch file (" in err and "GLOBAL posix.system" in err, err
    assert "Weights only load failed" not in err and not seen, (err, [str(w.message) for w in seen])


@pytest.mark.parametrize("name, make, expected", [
    ("config.json", "fifo", "config.json: not a regular file"),
    ("source.spm", "fifo", "source.spm: not a regular file"),
    ("model.safetensors", "dangling", "model.safetensors: a link to nothing"),
    ("model.safetensors", "fifo", "model.safetensors: not a regular file")])
def test_a_file_that_is_there_as_something_else_is_not_called_missing(marian_dir, tmp_path, capsys, name, make,
                                                                      expected):
    import os
    import shutil

    folder = tmp_path / "hostile"
    shutil.copytree(marian_dir, folder)
    (folder / name).unlink()
    if make == "fifo":
        os.mkfifo(folder / name)
    else:
        (folder / name).symlink_to(tmp_path / "nothing-here")
    assert main(["import", str(folder), "--out", str(tmp_path / "run")]) == 2
    err = _one_line(capsys)
    assert expected in err and "missing" not in err.split("(")[0], err


def test_an_import_with_two_vocabularies_exports_both(marian_dir, tmp_path):
    """Marian's separate_vocabs: the export writes the target's vocabulary apart (only the source's before, so
    MarianTokenizer read target ids as source pieces)."""
    settings = json.loads((marian_dir / "tokenizer_config.json").read_text())
    theirs = json.loads((marian_dir / "target_vocab.json").read_text())
    assert settings.get("separate_vocabs") is True and theirs != json.loads((marian_dir / "vocab.json").read_text())
    assert main(["import", str(marian_dir), "--out", str(tmp_path / "run")]) == 0
    assert main(["export", "--model", str(tmp_path / "run"), "--to", "transformers", "--out",
                 str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "target_vocab.json").read_text()) == theirs
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["separate_vocabs"] is True
    transformers = pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        before = transformers.MarianTokenizer.from_pretrained(marian_dir)
        after = transformers.MarianTokenizer.from_pretrained(tmp_path / "hf")
    ids = list(range(3, min(len(theirs), 20)))
    assert after.decode(ids) == before.decode(ids)


# ---- exercise check --------------------------------------------------------------------------------
@pytest.fixture
def sheet_dir(tmp_path, capsys) -> Path:
    assert main(["exercise", "new", "--kind", "attention", "--seed", "0", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    return tmp_path


def test_answers_of_1e308_give_a_verdict_without_a_numpy_warning(sheet_dir, capsys):
    key = json.loads((sheet_dir / "key.json").read_text(encoding="utf-8"))
    n, m = len(key["scores"]), len(key["scores"][0])
    answers = {**key, "scores": [[1e308] * m] * n, "weights": [[-1e308] * m] * n}
    (sheet_dir / "a.json").write_text(json.dumps(answers))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                  # a RuntimeWarning (overflow) fails
        assert main(["exercise", "check", str(sheet_dir / "exercise.json"), str(sheet_dir / "a.json"),
                     "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    got = json.loads(captured.out)
    verdicts = {c["path"]: c["verdict"] for c in got["cells"]}
    assert got["verdict"] == "wrong" and verdicts["scores"] == verdicts["weights"] == "wrong", got
    assert verdicts["output"] == "right"                                # the key's own output, written as given


def test_a_sheet_whose_numbers_overflow_is_refused(sheet_dir, capsys):
    doc = json.loads((sheet_dir / "exercise.json").read_text(encoding="utf-8"))
    doc["q"] = [[1e300] * len(row) for row in doc["q"]]
    doc["k"] = [[1e300] * len(row) for row in doc["k"]]
    huge = sheet_dir / "huge"
    huge.mkdir()
    (huge / "exercise.json").write_text(json.dumps(doc))
    n, m = len(doc["q"]), len(doc["k"])
    (huge / "a.json").write_text(json.dumps({"scores": [["-inf"] * m] * n}))   # would match an infinite score
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["exercise", "check", str(huge / "exercise.json"), str(huge / "a.json")]) == 2
        where = huge / "exercise.json"
        assert _one_line(capsys).strip() == (f"glassformer exercise: error: {where}: q[0][0]: 1e+300 is beyond "
                                             "±1e+12 (MAX_SPEC_MAGNITUDE)")
        assert main(["exercise", "check", "--no-limits", str(huge / "exercise.json"), str(huge / "a.json")]) == 2
    err = _one_line(capsys)                                     # limits lifted: the key itself is refused
    assert f"{huge / 'exercise.json'}: scores: " in err and "inf or NaN" in err, err


def test_bugs_run_is_quiet_on_overflow(sheet_dir):
    import numpy as np

    from glassformer.lesson.exercises.bugs import run
    from glassformer.lesson.exercises.sheet import load_sheet

    sheet = load_sheet(str(sheet_dir / "exercise.json"))
    n, m = sheet.n_queries, sheet.n_keys
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        values = run(sheet, own={"weights": np.full((n, m), -1e308)})
    assert not np.isfinite(values["output"]).all()
