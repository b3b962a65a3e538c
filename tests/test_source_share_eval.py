"""`glassformer evaluate --source-share` (interpret/evaluation.py): the usual scores unchanged, then the source
share of every output word over the split; without the flag, decoding's evaluate itself. The command is reached
through glassformer.cli with COMMANDS["evaluate"] pointed at interpret.evaluation (so this keeps working once
cli.py points there itself)."""

from __future__ import annotations

import json

import pytest

from glassformer import cli

SPLIT = ["--split", "everyday", "--compile", "off"]     # 20 sentences


@pytest.fixture(scope="module")
def model_dir(short_tiny_run):
    """The tiny preset on 120 pairs (conftest.py)."""
    return short_tiny_run


@pytest.fixture
def wrapped(monkeypatch):
    monkeypatch.setitem(cli.COMMANDS, "evaluate", ("glassformer.interpret.evaluation", cli.COMMANDS["evaluate"][1]))


def _run(capsys, argv):
    try:
        code = cli.main(argv)
    except SystemExit as done:
        code = done.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def plain(model_dir):
    """decoding's own `evaluate --json --hypotheses` on the tiny model (COMMANDS as cli.py has it)."""
    import contextlib
    import io

    from glassformer.decoding import commands

    parser = cli.OneLineParser()
    commands.add_evaluate_arguments(parser)
    args = parser.parse_args(["--model", str(model_dir), *SPLIT, "--json", "--hypotheses"])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert commands.evaluate_command(args) == 0
    return json.loads(printed.getvalue())


def test_without_the_flag_it_is_decodings_evaluate(model_dir, plain, wrapped, capsys):
    code, out, _ = _run(capsys, ["evaluate", "--model", str(model_dir), *SPLIT, "--json", "--hypotheses"])
    assert code == 0 and json.loads(out) == plain


def test_source_share_json_carries_the_distribution_and_the_usual_scores(model_dir, plain, wrapped, capsys):
    code, out, _ = _run(capsys, ["evaluate", "--model", str(model_dir), *SPLIT, "--json", "--source-share"])
    assert code == 0
    result = json.loads(out)
    share = result.pop("source_share")
    assert result == {k: v for k, v in plain.items() if k != "hypotheses"}       # the scores unchanged
    assert share["method"] == "alti" and share["steps"] is None
    assert len(share["per_sentence"]) == plain["sentences"] == 20
    for name in ("words", "sentences"):
        d = share[name]
        assert set(d) == {"count", "mean", "q1", "median", "q3", "below_half"}
        assert d["count"] > 0 and 0.0 <= d["q1"] <= d["median"] <= d["q3"] <= 1.0
        assert 0.0 <= d["mean"] <= 1.0 and 0.0 <= d["below_half"] <= 1.0
    assert share["sentences"]["count"] == sum(s is not None for s in share["per_sentence"])
    assert share["words"]["count"] >= share["sentences"]["count"]                 # at least the EOS row each
    lows = [item["share"] for item in share["lowest"]]
    assert lows == sorted(lows) and lows[0] == min(s for s in share["per_sentence"] if s is not None)
    assert all(item["hypothesis"] == plain["hypotheses"][item["index"]] for item in share["lowest"])
    code, out, _ = _run(capsys, ["evaluate", "--model", str(model_dir), *SPLIT, "--json", "--source-share",
                                 "--hypotheses"])
    assert code == 0 and json.loads(out)["hypotheses"] == plain["hypotheses"]


def test_source_share_text_follows_the_scores(model_dir, plain, wrapped, capsys):
    code, out, _ = _run(capsys, ["evaluate", "--model", str(model_dir), *SPLIT, "--source-share", "--show", "1"])
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (f"everyday (20 sentences, input raw, beam 4): BLEU {plain['bleu']:.2f}  "
                        f"chrF {plain['chrf']:.2f}")
    assert lines[1].strip() == plain["bleu_signature"] and lines[2].strip() == plain["chrf_signature"]
    assert lines[3].startswith("source share (alti") and lines[4].lstrip().startswith("word rows")
    assert lines[5].lstrip().startswith("sentence means") and "out: " in out


def test_a_gradient_share_method(model_dir, wrapped, capsys):
    code, out, _ = _run(capsys, ["evaluate", "--model", str(model_dir), *SPLIT, "--json", "--source-share",
                                 "--share-method", "input-x-gradient"])
    share = json.loads(out)["source_share"]
    assert code == 0 and share["method"] == "input-x-gradient" and 0.0 <= share["words"]["mean"] <= 1.0


@pytest.mark.parametrize("args, says", [
    (["--share-method", "alti"], "only with --source-share"),
    (["--source-share", "--share-method", "attention"], "--share-method"),
    (["--source-share", "--split", "train"], "--split"),
    (["--source-share", "--split", "tatoeba", "--input", "gold"], "--input gold"),
])
def test_bad_input_is_one_line_exit_2(model_dir, wrapped, capsys, args, says):
    code, out, err = _run(capsys, ["evaluate", "--model", str(model_dir), "--compile", "off", *args])
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and says in err, err
