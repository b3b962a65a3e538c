"""Greedy's block of k steps a call (decoding/search.py `steps`, compiled by inference/compiler.py): the tokens of
one step a call and of the eager model, sentence for sentence, with sentences ending at every offset inside a
block, at their limits and at the model's last position; each sentence of a batch as it decodes alone; PAD after a
sentence's end and the live count the loop reads. (A block that fails to build: tests/test_compiled.py.)"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest
import torch

from glassformer.decoding.search import Greedy, Slots, generate, step, steps
from glassformer.inference import compiler
from glassformer.inference.compiler import CompiledDecoder
from glassformer.model import ModelConfig, Transformer
from glassformer.model.cache import KVCache
from test_compiled import HAS_CXX, eos_likely, sources, tiny


@pytest.fixture
def blocks(monkeypatch):
    """A CompiledDecoder with greedy's blocks of k steps whose parts are the traced modules themselves, run eagerly
    (no trace, no build): the block's function and the run's marshalling of the cache into it and back."""
    monkeypatch.setattr(compiler, "prepacks", lambda *a: True)             # symbolic rows: few-row and many-row kinds

    def make(model, k: int):
        decoder = CompiledDecoder(model, step, Path("/nonexistent"), threads=1, steps=steps)
        decoder.per_call = {"few": k, "many": k}

        def build(kind, search, inputs, rows, k=1):                         # the module itself, eagerly
            fn = functools.partial(steps, k=k) if k > 1 else step
            module = compiler.Source(decoder.fast) if search is None else compiler.Step(decoder.fast, fn, search)
            return lambda flat: module(*flat)
        monkeypatch.setattr(decoder, "_build", build)
        return decoder
    return make


def _ends(hyps, limits) -> list[int]:
    """The step at which each sentence ended: its tokens and EOS, or its limit."""
    return [len(h[0].tokens) + 1 if h[0].finished else int(limit) for h, limit in zip(hyps, limits, strict=True)]


def _ids(hyps) -> list[tuple[list[int], bool]]:
    return [(h[0].tokens, h[0].finished) for h in hyps]


def ends_everywhere() -> tuple[Transformer, torch.Tensor]:
    """A seeded model and 48 sources (every other one padded) under which greedy's sentences end with EOS at 14
    different steps (1 to 29: every offset of a block of 3, 4 or 8) and 11 never do (to the model's max_len, 40)."""
    torch.manual_seed(5)
    model = Transformer(ModelConfig(src_vocab=60, tgt_vocab=50, d_model=32, heads=4, d_ff=64, encoder_layers=2,
                                    decoder_layers=2, max_len=40, dropout=0.0, head_bias=True)).eval()
    with torch.no_grad():
        model.head.bias[model.cfg.eos_id] = 2.5
    src = torch.randint(3, 60, (48, 9), generator=torch.Generator().manual_seed(1))
    for row in range(1, 48, 2):
        src[row, 9 - row % 7 - 1:] = model.cfg.pad_id
    return model, src


@pytest.mark.parametrize("k", [3, 4, 8])
def test_a_block_gives_one_step_a_calls_tokens_sentences_ending_at_every_offset_in_it(k, blocks):
    """Sentences end with EOS at every offset of a block, at their own limits (the default 2 x source + 10, or given
    ones) and at the model's last position: the block's hypotheses are the eager model's and those of one step a
    call, in batches of 48 and of 1 (the ids; no scores: NaN)."""
    model, src = ends_everywhere()
    search, last = Greedy(scores=False), model.cfg.max_len
    for max_len in (last, None, torch.tensor([3, 7, 6, 5] * 12)):
        want = generate(model, src, search, max_len=max_len)
        if isinstance(max_len, int):
            ends = [len(h[0].tokens) + 1 for h in want if h[0].finished]
            assert {(end - 1) % k for end in ends} == set(range(k))        # EOS at every offset of a block
            assert max(len(h[0].tokens) for h in want) == last              # and the model's last position
        assert any(not h[0].finished for h in want)                        # some end at their limits
        decoder = blocks(model, k)
        got = generate(model, src, search, max_len=max_len, compiled=decoder)
        assert _ids(got) == _ids(want) and all(math.isnan(h[0].score) for h in got)
        assert _ids(generate(model, src, search, max_len=max_len, compiled=blocks(model, 1))) == _ids(want)
    alone = [generate(model, src[i: i + 1], search, max_len=last, compiled=decoder)[0] for i in range(0, 48, 3)]
    assert _ids(alone) == _ids(generate(model, src, search, max_len=last)[::3])
    assert set(decoder.k.values()) == {k} and {("greedy", 64), ("greedy", 1)} <= set(decoder.k)   # many rows, few


def test_a_batch_of_sentences_that_end_at_different_steps_gives_each_what_it_gets_alone(blocks):
    """A batch shrinks at block edges (the live slots move to the front, the bucket halves): each sentence's ids are
    those it gets alone, in blocks and eagerly; a block that runs past every limit (the model's last position held)
    changes nothing."""
    model = tiny()
    src = sources(batch=7)
    limits = torch.tensor([3, 40, 5, 1, 9, 7, 22])
    decoder = blocks(model, 3)
    batch = generate(model, src, Greedy(scores=False), max_len=limits, compiled=decoder)
    for i in range(src.size(0)):
        alone = generate(model, src[i: i + 1], Greedy(scores=False), max_len=limits[i: i + 1])
        assert _ids(batch[i: i + 1]) == _ids(alone)
        assert _ids(generate(model, src[i: i + 1], Greedy(scores=False), max_len=limits[i: i + 1],
                             compiled=decoder)) == _ids(alone)
    assert [len(h[0].tokens) for h in batch] == [3, 40, 5, 1, 9, 7, 22]     # every sentence to its limit


def test_the_block_writes_pad_after_each_end_and_counts_the_live():
    """`steps` on the model itself, eagerly: k steps give the tokens of k single steps, each slot's history holds
    PAD after its EOS and after its limit, `live` turns False at the step a sentence ends, and the count is its sum."""
    model = eos_likely()
    src = sources(batch=6)
    src_pad = src == model.cfg.pad_id
    limits = torch.tensor([3, 12, 5, 1, 9, 7])
    n, k, ahead = 6, 12, 11
    memory = model.encode(src, src_pad)
    want = generate(model, src, Greedy(scores=False), max_len=limits)
    ends = _ends(want, limits)
    assert len(set(ends)) >= 3 and ends != [min(e, k) for e in limits.tolist()]   # some end by EOS, some at limits
    slots = Slots(torch.full((n,), model.cfg.bos_id), torch.zeros(n, 1, dtype=torch.float64), limits,
                  torch.ones(n, dtype=torch.bool), torch.full((n,), -math.inf, dtype=torch.float64),
                  torch.zeros(n, int(limits.max()) + ahead, dtype=torch.long))
    cache = KVCache(capacity=16, position=torch.tensor(0))
    alpha = torch.tensor(1.0, dtype=torch.float64)
    with torch.no_grad():
        tokens, scores, live, history, count = steps(model, Greedy(scores=False), cache, memory, src_pad, slots,
                                                     torch.tensor(1), alpha, k)
    assert not live.any() and int(count) == 0 and cache.length == k
    for row, (hyps, end) in enumerate(zip(want, ends, strict=True)):
        ids = history[row].tolist()
        assert ids[:end] == hyps[0].tokens + [model.cfg.eos_id] * hyps[0].finished   # by EOS, or at its limit
        assert ids[end: k] == [model.cfg.pad_id] * (k - end), (row, ids)      # PAD from its end to the block's
        assert tokens[row] == model.cfg.pad_id and scores[row, 0] == -math.inf
    with torch.no_grad():                                                   # a block of 2: who is still live
        _, _, live, _, count = steps(model, Greedy(scores=False), KVCache(capacity=16, position=torch.tensor(0)),
                                     memory, src_pad, slots, torch.tensor(1), alpha, 2)
    assert live.tolist() == [end > 2 for end in ends] and int(count) == sum(end > 2 for end in ends)


@pytest.mark.xdist_group("eos_likely_packages")
@pytest.mark.slow
@pytest.mark.skipif(not HAS_CXX, reason="needs a C++ compiler")
def test_compiled_blocks_give_the_models_ids_and_a_second_decoder_builds_nothing(shared_packages):
    """Greedy's blocks built for two threads, 3 steps a call at a few rows (one package for any), 2 at 5-8 (on MKL's
    packs one for that count, else one for any), beside test_compiled.py's packages of the same model in the
    session's folder: sentences that end at every offset of either block (by EOS or at their limits) and at the
    model's last position get the eager model's ids and those of the one-step packages (Greedy with scores); a
    second decoder finds every part without a trace and builds nothing."""
    model, src, per_call = eos_likely(), sources(batch=16, length=9), {"few": 3, "many": 2}
    limits = torch.tensor([40, 9, 9, 2, 11, 9, 30, 4, 9, 9, 13, 6, 9, 7, 9, 39])   # 40: the model's max_len
    want = generate(model, src, Greedy(scores=False), max_len=limits)
    ends = _ends(want, limits)
    assert all({(end - 1) % k for end in ends} == set(range(k)) for k in per_call.values()) and max(ends) == 40
    chunks = [slice(0, 4), slice(4, 8), slice(8, 12), slice(12, 16), slice(0, 7)]   # a few rows, then 8

    def ids(decoder, search=None):
        return [h for c in chunks for h in generate(model, src[c], search or Greedy(scores=False), max_len=limits[c],
                                                     compiled=decoder)]
    expected = [h for c in chunks for h in want[c]]
    notes: list[str] = []
    decoder = CompiledDecoder(model, step, shared_packages, notes.append, threads=2, steps=steps)
    decoder.per_call = per_call
    assert _ids(ids(decoder)) == _ids(expected) and not any("failed" in n for n in notes), notes
    assert decoder.k["greedy", 4] == 3 and decoder.k["greedy", 8] == 2
    single = CompiledDecoder(model, step, shared_packages, threads=2)          # one step a call
    assert [h[0].tokens for h in ids(single, Greedy())] == [h[0].tokens for h in expected]
    again: list[str] = []
    second = CompiledDecoder(model, step, shared_packages, again.append, threads=2, steps=steps)
    second.per_call = per_call
    export = torch.export.export
    try:
        torch.export.export = None                                           # found without a trace
        assert _ids(ids(second)) == _ids(expected)
    finally:
        torch.export.export = export
    assert again == [] and "greedy-few-k3" in second.parts and any(str(k).endswith("-k2") for k in second.parts)
