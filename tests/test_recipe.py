"""The recipe's regularisers and schedule: the cool-down, word dropout, attention dropout, BPE-dropout."""

from __future__ import annotations

import json

import pytest
import torch

from glassformer.cli import main
from glassformer.data.batching import drop_words
from glassformer.data.corpus import load_corpus
from glassformer.data.datasets import load_split
from glassformer.data.pieces import PieceDropout
from glassformer.data.tokenize import PAD, UNK, TargetTokenizer
from glassformer.training.schedule import noam_lr, noam_schedule
from glassformer.training.settings import preset_settings

D, WARMUP, FACTOR = 64, 100, 2.0


def _run(total: int, cooldown: float, done: int = 0) -> list[float]:
    """The learning rate of every step from done + 1 to total, as the optimizer sees it."""
    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.Adam([weight], lr=1.0)
    schedule = noam_schedule(optimizer, D, FACTOR, WARMUP, done=done, total=total, cooldown=cooldown)
    rates = []
    for _ in range(done, total):
        rates.append(optimizer.param_groups[0]["lr"])
        weight.grad = torch.ones(2)
        optimizer.step()
        schedule.step()
    return rates


def test_the_cooldown_leaves_the_noam_rate_then_falls_linearly_to_zero():
    total, cooldown = 1000, 0.3
    rates = _run(total, cooldown)
    for step in (1, 50, 100, 400, 700):                    # before the cool-down: the paper's rate itself
        assert rates[step - 1] == pytest.approx(noam_lr(step, D, FACTOR, WARMUP), rel=1e-12), step
    tail = rates[700:]                                      # steps 701..1000: 300 steps, a linear factor
    factors = [lr / noam_lr(s, D, FACTOR, WARMUP) for s, lr in zip(range(701, 1001), tail, strict=True)]
    assert factors[0] == pytest.approx(1.0) and factors[-1] == pytest.approx(1 / 300)
    steps = [b - a for a, b in zip(factors, factors[1:], strict=False)]
    assert max(steps) == pytest.approx(min(steps)) == pytest.approx(-1 / 300)
    assert all(b < a for a, b in zip(tail, tail[1:], strict=False))


def test_without_cooldown_the_schedule_is_the_paper_one_and_resume_agrees():
    assert _run(300, 0.0) == pytest.approx([noam_lr(s, D, FACTOR, WARMUP) for s in range(1, 301)], rel=1e-12)
    assert _run(1000, 0.3, done=850) == pytest.approx(_run(1000, 0.3)[850:], rel=1e-12)


def test_word_dropout_replaces_units_at_its_rate_and_never_a_pad():
    src = torch.randint(4, 500, (64, 40))
    src[:, 30:] = PAD                                       # every row padded at the right
    gen = torch.Generator().manual_seed(0)
    dropped = drop_words(src, 0.2, gen)
    changed = dropped != src
    assert (dropped[changed] == UNK).all()
    assert not changed[:, 30:].any()                        # PAD stays PAD
    rate = changed[:, :30].float().mean().item()
    assert 0.17 < rate < 0.23, rate
    assert torch.equal(drop_words(src, 0.0), src)


def test_the_new_knobs_are_checked_flags(capsys):
    for argv, words in ((["--cooldown", "1.0"], "--cooldown"), (["--word-dropout", "-0.1"], "--word-dropout"),
                        (["--attention-dropout", "1.5"], "--attention-dropout"),
                        (["--bpe-dropout", "1"], "--bpe-dropout")):
        code = main(["train", "--preset", "tiny", "--quiet", *argv])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and words in err, err


def test_a_tiny_run_with_the_regularisers_trains_and_cools_to_zero(tmp_path):
    out = tmp_path / "run"
    code = main(["train", "--preset", "tiny", "--limit", "48", "--max-tokens", "128", "--quiet", "--threads", "1",
                 "--epochs", "2", "--cooldown", "0.5", "--word-dropout", "0.2", "--attention-dropout", "0.1",
                 "--log-every", "1", "--no-eval", "--out", str(out)])
    assert code == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["attention_dropout"] == 0.1
    assert config["train"]["cooldown"] == 0.5 and config["train"]["word_dropout"] == 0.2
    rates = [json.loads(x)["lr"] for x in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(x)["kind"] == "step"]
    total = len(rates)                                      # tiny: d 32, factor 1.0, warm-up 50
    cool = total - total // 2
    assert rates[-1] == pytest.approx(noam_lr(total, 32, 1.0, 50) / cool, rel=1e-6)     # the last step: 1/cool
    assert rates[total // 2 - 1] == pytest.approx(noam_lr(total // 2, 32, 1.0, 50), rel=1e-6)
    assert preset_settings("tiny").cooldown == 0.0          # presets that do not ask for it keep the paper's rate


@pytest.fixture(scope="module")
def english():
    """A BPE trained on the HSK training English, and the dev + test English it never saw."""
    tokenizer = TargetTokenizer.train([p.en for p in load_corpus().split("train")], 2000)
    return tokenizer, [p.en for p in (*load_split("dev"), *load_split("test"))] + [
        "Don't stop -- it's 5:30 p.m.; (really) \"quoted\" text!", "naïve café, 100% Ω"]


def test_bpe_dropout_at_zero_gives_the_tokenizers_own_pieces(english):
    tokenizer, sentences = english
    cut = PieceDropout(tokenizer)
    for text in sentences:                                  # merges redone from characters by the test's loop
        ids = tokenizer.encode(text)
        assert cut(ids, 0.0, 1) == ids, (text, tokenizer.tokens(text))


def test_bpe_dropout_cuts_words_smaller_from_the_same_characters_and_is_seeded(english):
    tokenizer, sentences = english
    cut = PieceDropout(tokenizer)
    piece = {i: tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)}
    before = after = changed = 0
    for n, text in enumerate(sentences):
        ids = tokenizer.encode(text)
        out = cut(ids, 0.1, n)
        assert "".join(piece[i] for i in out) == "".join(piece[i] for i in ids)   # the same text, other cuts
        assert out == cut(ids, 0.1, n)                      # the seed decides
        before, after, changed = before + len(ids), after + len(out), changed + (out != ids)
    assert 1.05 < after / before < 1.6, after / before      # smaller pieces, more of them
    assert changed > len(sentences) // 3
    ids = tokenizer.encode("yesterday")
    assert len({tuple(cut(ids, 0.3, seed)) for seed in range(40)}) > 3     # another seed, other cuts
    chars = cut(tokenizer.encode("I gave him a book yesterday."), 0.999999, 0)
    assert [piece[i] for i in chars] == list("▁I▁gave▁him▁a▁book▁yesterday.")  # every merge skipped
