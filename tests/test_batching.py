"""Token-count batching: coverage, the max-tokens cap, determinism, padding layout, DDP step counts."""

from __future__ import annotations

import random

import pytest
import torch

from glassformer.data.batching import (
    Example,
    collate,
    make_batches,
    pad_to_multiple,
    padded,
    padded_size,
    rank_share,
    step_groups,
)
from glassformer.data.tokenize import BOS, EOS, PAD
from glassformer.model import ModelConfig, Transformer


def _examples(n: int = 300, seed: int = 0) -> list[Example]:
    rng = random.Random(seed)
    return [Example([rng.randrange(4, 50) for _ in range(rng.randint(1, 20))],
                    [rng.randrange(4, 60) for _ in range(rng.randint(1, 25))]) for _ in range(n)]


def test_every_example_exactly_once_per_epoch():
    ex = _examples()
    for epoch in range(3):
        batches = make_batches(ex, max_tokens=120, seed=7, epoch=epoch, pool_size=64)
        flat = sorted(i for b in batches for i in b)
        assert flat == list(range(len(ex)))


def test_max_tokens_including_padding_is_respected():
    ex = _examples() + [Example([5] * 90, [6] * 3)]          # one example wider than the cap
    batches = make_batches(ex, max_tokens=64, seed=1, epoch=0)
    for b in batches:
        batch = collate(ex, b)
        size = max(batch.src.numel(), batch.tgt_in.numel())
        assert size <= 64 or len(b) == 1                     # only a lone over-wide example may exceed
        assert padded_size(ex, b) >= size
    lone = [b for b in batches if len(ex) - 1 in b]
    assert lone == [[len(ex) - 1]]


def test_bucketing_keeps_padding_low():
    ex = _examples(600)
    batches = make_batches(ex, max_tokens=200, seed=3, epoch=0)
    real = sum(len(e.tgt) + 1 for e in ex)
    with_pad = sum(collate(ex, b).labels.numel() for b in batches)
    shuffled = list(range(len(ex)))
    random.Random(0).shuffle(shuffled)
    size = max(1, len(ex) // len(batches))
    naive = sum(collate(ex, shuffled[i:i + size]).labels.numel() for i in range(0, len(ex), size))
    assert with_pad < naive                                    # sorting within pools beats random batches
    assert real / with_pad > 0.6


def test_deterministic_given_seed_and_epoch():
    ex = _examples()
    a = make_batches(ex, 100, seed=5, epoch=2)
    assert a == make_batches(ex, 100, seed=5, epoch=2)
    assert a != make_batches(ex, 100, seed=5, epoch=3)
    assert a != make_batches(ex, 100, seed=6, epoch=2)


def test_collate_right_pads_and_shifts():
    ex = [Example([10, 11, 12], [20, 21]), Example([13], [22, 23, 24, 25])]
    b = collate(ex, [0, 1])
    assert b.src.tolist() == [[10, 11, 12], [13, PAD, PAD]]
    assert b.tgt_in.tolist() == [[BOS, 20, 21, PAD, PAD], [BOS, 22, 23, 24, 25]]
    assert b.labels.tolist() == [[20, 21, EOS, PAD, PAD], [22, 23, 24, 25, EOS]]
    assert b.n_tokens == 3 + 5


def test_ddp_step_groups_give_every_rank_the_same_step_count():
    ex = _examples(97)
    batches = make_batches(ex, 80, seed=0, epoch=0)
    for world in (2, 3, 4):
        for accumulate in (1, 2):
            groups = step_groups(batches, world, accumulate)
            shares = [[rank_share(g, r, accumulate) for g in groups] for r in range(world)]
            assert all(len(s) == len(groups) for s in shares)
            assert all(len(x) == accumulate for s in shares for x in s)
            seen = {i for s in shares for step in s for b in step for i in b}
            assert seen == set(range(len(ex)))               # padding repeats, never drops
    assert pad_to_multiple([[0], [1], [2]], 2) == [[0], [1], [2], [0]]
    assert step_groups([[0], [1], [2]], 1, 1) == [[[0]], [[1]], [[2]]]


def test_loss_ignores_pad_rows():
    """A batch with extra PAD columns (a longer neighbour trimmed away) gives the same summed loss."""
    cfg = ModelConfig.tiny(src_vocab=60, tgt_vocab=70)
    model = Transformer(cfg).eval()
    ex = [Example([5, 6, 7], [8, 9]), Example([10, 11], [12, 13, 14])]
    b = collate(ex, [0, 1])
    loss, n = model.loss(b.src, b.tgt_in, b.labels, label_smoothing=0.1)
    pad = torch.zeros(2, 4, dtype=torch.long)
    loss2, n2 = model.loss(torch.cat([b.src, pad], 1), torch.cat([b.tgt_in, pad], 1),
                           torch.cat([b.labels, pad], 1), label_smoothing=0.1)
    assert n == n2 == 2 + 1 + 3 + 1
    assert loss2.item() == pytest.approx(loss.item(), rel=1e-5)
    one, _ = model.loss(b.src[:1, :3], b.tgt_in[:1, :3], b.labels[:1, :3], label_smoothing=0.1)
    two, _ = model.loss(b.src[1:, :2], b.tgt_in[1:], b.labels[1:], label_smoothing=0.1)
    assert (one + two).item() == pytest.approx(loss.item(), rel=1e-5)


def test_collate_pads_with_the_given_id_and_keeps_an_empty_source():
    ex = [Example([], [20]), Example([13, 14], [22, 23])]
    b = collate(ex, [1, 0], pad_id=7)
    assert b.src.tolist() == [[13, 14], [7, 7]] and b.src.dtype == torch.long
    assert b.tgt_in.tolist() == [[BOS, 22, 23], [BOS, 20, 7]]
    assert b.labels.tolist() == [[22, 23, EOS], [20, EOS, 7]] and b.index == [1, 0]


def test_padded_right_pads_ragged_and_empty_rows_as_pad_sequence_does():
    from torch.nn.utils.rnn import pad_sequence

    rows = [[5, 6, 7], [], [8], [9, 10, 11, 12]]
    want = pad_sequence([torch.tensor(r, dtype=torch.long) for r in rows], batch_first=True, padding_value=3)
    got = padded(rows, 3)
    assert got.dtype == torch.long and torch.equal(got, want)
    assert padded([], 0).shape == (0, 0) and padded([[], []], 0).shape == (2, 0)
