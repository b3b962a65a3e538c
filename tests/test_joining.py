"""Sentences joining a running batch (decoding/joining.py): greedy on compiled steps takes the next batches'
sentences into the slots of those that ended; each sentence still gets what it gets alone (tokens, scores, where it
ends), whatever column it joined at, through the cache's columns being dropped, at every position scheme the
compiled step takes."""

from __future__ import annotations

import math

import pytest
import torch

from glassformer.decoding import joining
from glassformer.decoding.search import Greedy, generate, step
from glassformer.inference.compiler import CompiledDecoder
from glassformer.model import Transformer
from glassformer.model.config import ModelConfig


def eos_likely(**changes) -> Transformer:
    torch.manual_seed(0)
    sizes = dict(src_vocab=60, tgt_vocab=50, d_model=32, heads=4, d_ff=64, encoder_layers=2, decoder_layers=2,
                 max_len=40, dropout=0.0, head_bias=True)
    model = Transformer(ModelConfig(**{**sizes, **changes})).eval()
    with torch.no_grad():
        model.head.bias[model.cfg.eos_id] = 3.0                        # sentences end at many different steps
    return model


def batches(n: int, size: int) -> list[torch.Tensor]:
    """`n` padded batches of `size` sources, 2-13 ids each (longer and shorter batches mixed)."""
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(n):
        lengths = torch.randint(2, 14, (size,), generator=g).tolist()
        src = torch.zeros(size, max(lengths), dtype=torch.long)
        for row, length in enumerate(lengths):
            src[row, :length] = torch.randint(3, 60, (length,), generator=g)
        out.append(src)
    return out


@pytest.fixture
def eager_packages(monkeypatch, tmp_path):
    """CompiledDecoder whose parts are the traced modules themselves, run eagerly (no build): the step's inputs,
    the joined column of each row among them."""
    def make(model):
        decoder = CompiledDecoder(model, step, tmp_path, threads=1)
        monkeypatch.setattr(decoder, "_found", lambda kind, search: None)
        monkeypatch.setattr(torch.export, "export", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no")))
        decoder.notes = lambda line: None
        return decoder
    return make


@pytest.mark.parametrize("shift_at", [joining.SHIFT_AT, 2])
@pytest.mark.parametrize("changes", [{}, {"positions": "learned"}, {"norm_placement": "pre"}])
def test_sentences_joining_a_running_batch_get_what_they_get_alone(changes, shift_at, eager_packages, monkeypatch):
    """Six batches of five through one run: each sentence's tokens, score and end are those it gets alone (where
    it began in the cache, at which column, after how many dropped columns); the run takes fewer steps than the
    batches one by one, so sentences did join running batches."""
    monkeypatch.setattr(joining, "SHIFT_AT", shift_at)
    model = eos_likely(**changes)
    srcs = batches(6, 5)
    alone = [generate(model, src[i: i + 1, : int((src[i] != 0).sum())], Greedy(), alpha=0.6)[0]
             for src in srcs for i in range(src.size(0))]
    assert len({len(h[0].tokens) for h in alone}) >= 5 and sum(h[0].finished for h in alone) >= 8
    decoder, calls = eager_packages(model), []
    run = decoder.step
    monkeypatch.setattr(decoder, "step", lambda *a, **k: calls.append(1) or run(*a, **k))
    joined = generate(model, srcs[0], Greedy(), alpha=0.6, compiled=decoder, more=iter(srcs[1:]))
    steps = len(calls)
    one_by_one = [generate(model, src, Greedy(), alpha=0.6, compiled=decoder) for src in srcs]
    assert [[h.tokens for h in hyps] for hyps in joined] == [[h.tokens for h in hyps] for hyps in alone]
    for got, want in zip(joined, alone, strict=True):
        assert got[0].finished == want[0].finished
        assert got[0].score == pytest.approx(want[0].score, abs=1e-5)
        assert got[0].normalized == pytest.approx(want[0].normalized, abs=1e-5)
    assert [h[0].tokens for hyps in one_by_one for h in hyps] == [h[0].tokens for h in joined]   # batch by batch
    assert steps < len(calls) - steps                                    # fewer steps than the batches one by one


def test_a_batch_without_more_and_a_beam_search_decode_as_before(eager_packages):
    """Joining is greedy's on compiled steps: `more` with a beam search (or eagerly) is a ValueError, not a
    silently different search."""
    model = eos_likely()
    srcs = batches(2, 3)
    with pytest.raises(ValueError, match="compiled greedy"):
        generate(model, srcs[0], Greedy(), more=iter(srcs[1:]))
    from glassformer.decoding.search import BeamSearch
    with pytest.raises(ValueError, match="compiled greedy"):
        generate(model, srcs[0], BeamSearch(2), compiled=eager_packages(model), more=iter(srcs[1:]))
    assert math.isfinite(generate(model, srcs[0], Greedy(), compiled=eager_packages(model))[0][0].score)


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_a_row_past_the_position_table_reads_its_last_position(positions):
    """A finished sentence's row keeps computing (dead) until the batch shrinks or another sentence takes its slot;
    counted from the column it began at, its position can pass the model's last: it reads the last (an index past
    the table was an IndexError eagerly, and memory past it in a compiled step), the live row beside it unchanged."""
    model = eos_likely(positions=positions)
    memory = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    both, alone = model.new_cache(), model.new_cache()
    both.joined, alone.joined = torch.tensor([0, 0]), torch.tensor([30])
    tokens = torch.tensor([[7], [9]])
    with torch.no_grad():
        for column in range(model.cfg.max_len + 6):                     # row 0 past position 39 at the end
            if column == 30:
                both.joined = torch.tensor([0, 30])                       # row 1: a sentence joins here
            logits = model.decode_step(tokens, memory, None, both)
            if column >= 30:
                mine = model.decode_step(tokens[1:], memory[1:], None, alone)
                assert torch.allclose(logits[1], mine[0], atol=1e-5)
            else:
                alone.length += 1                                          # its columns before it began
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("size", [3, 4, 6])
def test_a_sentence_that_joined_late_runs_past_the_models_last_column_alone(size, eager_packages):
    """Sentences that never end early (EOS made unlikely) run to their limits: the first batch's all end at one
    step, the next batch's join there (fewer columns in than SHIFT_AT, so none dropped then) with limits at the
    model's max_len, and run on with no sentence ending: their columns pass max_len unless the first columns are
    dropped at the model's last column (a step past the buffers was an index out of range, eagerly and in a
    package). Each sentence gets what it gets alone."""
    model = eos_likely(max_len=20)
    with torch.no_grad():
        model.head.bias[model.cfg.eos_id] = -30.0
    g = torch.Generator().manual_seed(5)
    short, long = torch.randint(3, 60, (size, 2), generator=g), torch.randint(3, 60, (size, 8), generator=g)
    alone = [generate(model, src[i: i + 1], Greedy())[0][0].tokens for src in (short, long) for i in range(size)]
    assert [len(t) for t in alone] == [14] * size + [20] * size              # each to its limit, none at EOS
    joined = generate(model, short, Greedy(), compiled=eager_packages(model), more=iter([long]))
    assert [hyps[0].tokens for hyps in joined] == alone
