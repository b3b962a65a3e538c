"""Run folders other people send: broken weights, wrong config types and sizes, mismatched vocabularies.
Each is one line naming the file and the problem, exit 2, and nothing is allocated before the checks."""

from __future__ import annotations

import json
import os
import shutil
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassformer.cli import main
from glassformer.data import checkpoint as ck
from glassformer.data.tokenize import Vocab
from glassformer.errors import UsageError
from glassformer.lab.api import untrained_model
from glassformer.model import ModelConfig


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    """A complete, loadable run folder (untrained weights over the lesson's words)."""
    folder = tmp_path_factory.mktemp("runs") / "good"
    lab = untrained_model()
    ck.save_run_files(folder, lab.model.cfg, {"preset": "test"}, lab.source, lab.target)
    ck.save_weights(lab.model, folder / ck.MODEL)
    return folder


@pytest.fixture
def run(good_run, tmp_path) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(good_run, folder)
    return folder


def one_line_exit_2(argv, capsys, *words):
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and "Traceback" not in err and err.startswith("glassformer "), err
    for w in words:
        assert w in err, (w, err)
    return err


COMMANDS = [
    lambda folder: ["translate", "--model", str(folder), "我"],
    lambda folder: ["explain", "--model", str(folder), "我给他"],
    lambda folder: ["evaluate", "--model", str(folder), "--split", "dev"],
    lambda folder: ["lab", "--model", str(folder), "--no-browser", "--port", "0"],
]


def test_the_good_folder_loads(good_run, capsys):
    assert main(["translate", "--model", str(good_run), "我／给／他"]) == 0
    assert capsys.readouterr().out.count("\n") == 1


@pytest.mark.parametrize("damage", ["truncated", "empty", "random"])
@pytest.mark.parametrize("command", range(len(COMMANDS)))
def test_broken_weights_are_one_line(run, capsys, damage, command):
    path = run / ck.MODEL
    raw = path.read_bytes()
    path.write_bytes({"truncated": raw[: len(raw) // 2], "empty": b"", "random": os.urandom(4096)}[damage])
    one_line_exit_2(COMMANDS[command](run), capsys, "model.safetensors")


def _edit_config(run: Path, **changes) -> None:
    data = json.loads((run / ck.CONFIG).read_text())
    data["model"].update(changes)
    (run / ck.CONFIG).write_text(json.dumps(data))


@pytest.mark.parametrize("changes, words", [
    ({"eps": "x"}, ["config.json", "eps", "expected a number"]),
    ({"d_model": "128"}, ["config.json", "d_model", "expected an integer"]),
    ({"colour": "red"}, ["config.json", "unknown field 'colour'"]),
    ({"d_model": 10**6}, ["config.json", "MAX_D_MODEL"]),
    ({"max_len": 10**9}, ["config.json", "MAX_LEN"]),
    ({"tgt_vocab": 10**9}, ["config.json", "MAX_VOCAB"]),
    ({"d_model": 4096, "d_ff": 16384, "encoder_layers": 40, "decoder_layers": 40}, ["config.json", "MAX_PARAMETERS"]),
    ({"heads": True}, ["config.json", "heads", "boolean"]),
])
def test_bad_config_is_refused_before_allocating(run, capsys, changes, words):
    _edit_config(run, **changes)
    tracemalloc.start()
    try:
        one_line_exit_2(["translate", "--model", str(run), "我"], capsys, *words)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20                  # these configs once tried to allocate 8-512 GB


def test_config_file_problems(run, capsys):
    (run / ck.CONFIG).write_bytes("{\"model\": 1}".encode("utf-16"))
    one_line_exit_2(["translate", "--model", str(run), "我"], capsys, "config.json", "UTF-16")
    (run / ck.CONFIG).write_text("[" * 30_000 + "]" * 30_000)
    one_line_exit_2(["translate", "--model", str(run), "我"], capsys, "config.json", "nested")
    (run / ck.CONFIG).write_text(json.dumps({"model": {}, "extra": 1}))
    one_line_exit_2(["translate", "--model", str(run), "我"], capsys, "config.json", "extra")


def test_weights_that_do_not_fit_the_config(run, good_run, capsys):
    _edit_config(run, d_ff=48)
    one_line_exit_2(["translate", "--model", str(run), "我"], capsys, "model.safetensors", "shape")


@pytest.mark.parametrize("side, delta", [("source", -3), ("source", 5), ("target", 2)])
def test_vocab_that_does_not_match_the_embeddings(run, capsys, side, delta):
    data = json.loads((run / ck.VOCAB).read_text())
    if side == "source":
        tokens = data["source"]["vocab"]["tokens"]
        data["source"]["vocab"]["tokens"] = tokens[:delta] if delta < 0 else tokens + [f"新{i}" for i in range(delta)]
    else:
        tok = json.loads(data["target"]["tokenizer"])
        vocab = tok["model"]["vocab"]
        for i in range(delta):
            vocab[f"extra{i}"] = len(vocab)
        data["target"]["tokenizer"] = json.dumps(tok)
    (run / ck.VOCAB).write_text(json.dumps(data, ensure_ascii=False))
    one_line_exit_2(["translate", "--model", str(run), "我"], capsys, "vocab.json", side, "entries")


def test_malformed_vocab_file(run, capsys):
    (run / ck.VOCAB).write_text(json.dumps({"source": {"type": "nonsense"}, "target": {}}))
    one_line_exit_2(["translate", "--model", str(run), "我"], capsys, "vocab.json", "source")


def test_vocabulary_loading_is_linear():
    tokens = [f"词{i}" for i in range(100_000)]
    started = time.perf_counter()
    vocab = Vocab(tokens + tokens[:1000])           # duplicates are dropped, order kept
    assert time.perf_counter() - started < 2.0       # once over a minute
    assert len(vocab) == 100_004 and vocab.token_to_id("词0") == 4 and vocab.token_to_id("词99999") == 100_003


def test_explain_does_not_suggest_an_option_it_lacks(good_run, capsys):
    err = one_line_exit_2(["explain", "--model", str(good_run), "我" * 100], capsys, "100 units", "limit")
    assert "--truncate" not in err


def test_beam_and_top_limits(good_run, capsys):
    one_line_exit_2(["translate", "--model", str(good_run), "--beam", "1000", "我"], capsys, "MAX_BEAM")
    one_line_exit_2(["explain", "--model", str(good_run), "--top", "1000", "我"], capsys, "MAX_TOP_K")


def test_no_limits_lifts_a_limit(good_run, capsys):
    assert main(["explain", "--model", str(good_run), "--top", "30", "--no-limits", "我／给／他"]) == 0
    capsys.readouterr()


# ---- generated junk at the config loader --------------------------------------------------------

JUNK = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=10)
FIELDS = st.sampled_from([f for f in ModelConfig.tiny().to_dict()])


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(changes=st.dictionaries(FIELDS | st.text(max_size=8), JUNK, max_size=3))
def test_generated_configs_are_valid_or_one_line(changes):
    data = {**ModelConfig.tiny().to_dict(), **changes}
    try:
        cfg = ModelConfig.from_dict(data, "config.json: model")
    except UsageError as error:
        assert "\n" not in str(error) and str(error).startswith("config.json: model")
    else:
        assert cfg.d_model > 0 and cfg.heads > 0
