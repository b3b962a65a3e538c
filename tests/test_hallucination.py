"""The hallucination signal (interpret/hallucination.py): the contrast set, the ROC AUC by hand, the sentence
shares on a tiny trained model, and `glassformer hallucination` (its JSON and its one-line errors)."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass

import pytest
import torch

from glassformer import cli, limits
from glassformer.data.datasets import load_split
from glassformer.errors import UsageError
from glassformer.interpret import hallucination as h

COMMAND = ("glassformer.interpret.hallucination", "the hallucination signal")


@dataclass
class P:
    id: str
    zh: str
    en: str


PAIRS = [P("a", "我很好。", "I am fine."), P("b", "你好。", "Hello there."),
         P("c", "我喜欢喝茶。", "I like to drink tea."), P("d", "他是学生。", "He is a student."),
         P("e", "她是学生。", "She is a student."), P("f", "谢谢！", "Thanks!")]


# ---- the contrast set ----------------------------------------------------------------------------------

def test_derangement_has_no_fixed_point_and_is_seeded():
    for n in (2, 3, 7, 50):
        for seed in range(5):
            perm = h.derangement(n, seed)
            assert sorted(perm) == list(range(n)) and all(perm[i] != i for i in range(n))
            assert perm == h.derangement(n, seed)
    with pytest.raises(UsageError, match="at least 2 pairs"):
        h.derangement(1)


def test_contrast_set_three_kinds_per_pair_none_wrong_equal_to_its_reference():
    pairs = [*PAIRS, P("g", "我很好。", "I am fine.")]                # a repeated reference: the repair walks on
    for seed in range(10):
        out = h.contrast_set(pairs, seed)
        assert [c.id for c in out] == [p.id for p in pairs]
        for c, p in zip(out, pairs, strict=True):
            assert c.right == p.en and c.zh == p.zh
            assert {k: c.target(k) for k in h.KINDS} == {"right": c.right, "swapped": c.swapped, "half": c.half}
            assert c.swapped.split() != p.en.split() and c.half.split() != p.en.split()
            assert c.swapped_from != pairs.index(p) and c.half_from != pairs.index(p)
            assert c.swapped == pairs[c.swapped_from].en
            words, other = p.en.split(), pairs[c.half_from].en.split()
            assert c.half.split()[: len(words) // 2] == words[: len(words) // 2]        # first half kept exactly
            assert c.half.split()[len(words) // 2:] == other[len(other) // 2:]         # the other's second half


def test_contrast_set_is_deterministic_by_seed():
    assert h.contrast_set(PAIRS, 3) == h.contrast_set(PAIRS, 3)
    assert len({tuple(c.swapped for c in h.contrast_set(PAIRS, s)) for s in range(6)}) > 1


def test_half_target_by_hand():
    assert h.half_target("I gave him a book yesterday.", "She likes tea.") == "I gave him likes tea."
    assert h.half_target("Thanks!", "He is a student.") == "a student."    # one word: nothing kept


def test_contrast_set_needs_two_different_references():
    with pytest.raises(UsageError, match="differs"):
        h.contrast_set([P("a", "我", "Same."), P("b", "你", "Same.")])


# ---- the ROC AUC ---------------------------------------------------------------------------------------

def test_roc_auc_hand_computed_cases():
    assert h.roc_auc([0.9, 0.8, 0.7], [0.1, 0.2]) == 1.0                    # perfect separation
    assert h.roc_auc([0.1, 0.2], [0.9, 0.8, 0.7]) == 0.0                    # reversed
    assert h.roc_auc([0.5, 0.5], [0.5, 0.5, 0.5]) == 0.5                    # all tied
    # right 0.9, 0.4, 0.6 against wrong 0.5, 0.4: wins 0.9>0.5, 0.9>0.4, 0.6>0.5, 0.6>0.4, tie 0.4=0.4 → 4.5 / 6
    assert h.roc_auc([0.9, 0.4, 0.6], [0.5, 0.4]) == pytest.approx(0.75, abs=1e-15)


def test_roc_auc_equals_the_pairwise_count():
    rng = random.Random(1)
    for _ in range(20):
        a = [rng.randint(0, 5) for _ in range(rng.randint(1, 12))]
        b = [rng.randint(0, 5) for _ in range(rng.randint(1, 12))]
        pairwise = sum(1.0 if x > y else 0.5 if x == y else 0.0 for x, y in itertools.product(a, b))
        assert h.roc_auc(a, b) == pytest.approx(pairwise / (len(a) * len(b)), abs=1e-12)
    with pytest.raises(ValueError):
        h.roc_auc([], [1.0])


# ---- on a tiny trained model ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tiny_run):
    """A run of the tiny preset (conftest.py)."""
    from glassformer.decoding.translator import Translator

    return tiny_run, Translator.load(tiny_run)


def test_shares_on_the_tiny_model_are_proportions_and_the_aucs_in_range(trained):
    """Properties only: on the tiny preset the right targets' shares do not stand above the swapped ones'.
    Tried on dev[:24], training seeds 1-5 × contrast seeds 0-2: alti AUC 0.48-0.56, mean right − swapped
    between −0.001 and +0.003, either sign (input × gradient and integrated gradients alike), so no separation
    is asserted; docs/attribution.md reports it on the default model."""
    _, t = trained
    pairs = load_split("dev")[:16]
    result = h.measure(t.model, t.source, t.target, pairs, ["alti", "input-x-gradient", "integrated-gradients"],
                       steps=2)
    assert result["sentences"] + result["skipped"] == len(pairs) and result["sentences"] > 10
    for method, r in result["methods"].items():
        for kind in h.KINDS:
            assert 0.0 <= r["mean"][kind] <= 1.0, (method, kind)
        for kind in h.WRONG:
            assert 0.0 <= r["auc"][kind] <= 1.0 and 0.0 <= r["right_above"][kind] <= 1.0
    c = h.contrast_set(pairs)[0]
    src = torch.tensor([t.source.analyse(c.zh).ids])
    tgt_in, labels = h.teacher_forced(t.model, t.target, c.right)
    shares = h.row_shares(t.model, src, tgt_in, labels, "alti")
    assert len(shares) == len(labels) == tgt_in.size(1) and all(0.0 <= s <= 1.0 for s in shares)
    assert h.sentence_share(shares) == pytest.approx(sum(shares) / len(shares))
    assert h.sentence_share([None, 0.2, 0.4]) == pytest.approx(0.3) and h.sentence_share([None]) is None


# ---- glassformer hallucination -------------------------------------------------------------------------

@pytest.fixture
def command(monkeypatch):
    monkeypatch.setitem(cli.COMMANDS, "hallucination", COMMAND)


def _run(capsys, argv):
    """Exit status, stdout and stderr of `glassformer ARGV` (argparse's errors exit through SystemExit)."""
    try:
        code = cli.main(argv)
    except SystemExit as done:
        code = done.code
    out, err = capsys.readouterr()
    return code, out, err


def test_command_json_keys(trained, command, capsys):
    folder, _ = trained
    code, out, _ = _run(capsys, ["hallucination", "--model", str(folder), "--split", "everyday", "--sentences", "6",
                                 "--methods", "alti,integrated-gradients", "--steps", "2", "--json"])
    assert code == 0
    result = json.loads(out)
    assert set(result) == {"model", "split", "sentences", "skipped", "seed", "steps", "rows", "methods", "reference"}
    assert set(result["reference"]) == {"seq-logprob"}
    assert result["split"] == "everyday" and result["sentences"] == 6 and result["steps"] == 2
    assert list(result["methods"]) == ["alti", "integrated-gradients"]
    for r in result["methods"].values():
        assert set(r) == {"mean", "auc", "right_above"}
        assert set(r["mean"]) == set(h.KINDS) and set(r["auc"]) == set(h.WRONG)
    code, text, _ = _run(capsys, ["hallucination", "--model", str(folder), "--split", "everyday", "--sentences", "4",
                                  "--methods", "alti"])
    assert code == 0 and "ROC AUC" in text and "\nalti " in text


@pytest.mark.parametrize("args, says", [
    (["--sentences", "0"], "--sentences"),
    (["--sentences", "x"], "--sentences"),
    (["--sentences", str(limits.MAX_HALLUCINATION_SENTENCES + 1)], "MAX_HALLUCINATION_SENTENCES"),
    (["--methods", "attention"], "attention has no source share"),
    (["--methods", "alti,nonsense"], "'nonsense' is not one of"),
    (["--methods", "alti,alti"], "named twice"),
    (["--methods", ""], "comma-separated"),
    (["--methods", "alti,"], "comma-separated"),
    (["--steps", "0"], "--steps"),
    (["--steps", str(limits.MAX_IG_STEPS + 1)], "MAX_IG_STEPS"),
    (["--split", "train"], "--split"),
    (["--seed", "one"], "--seed"),
])
def test_bad_input_is_one_line_exit_2(trained, command, capsys, args, says):
    folder, _ = trained
    code, out, err = _run(capsys, ["hallucination", "--model", str(folder), *args])
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and says in err, err


def test_a_missing_model_is_one_line_exit_2(command, capsys, tmp_path):
    code, _, err = _run(capsys, ["hallucination", "--model", str(tmp_path / "none")])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no trained model" in err
