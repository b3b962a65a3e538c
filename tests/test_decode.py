"""Decoding: cached logits equal recomputed ones, batch composition does not change a translation,
beam search finds the exhaustive optimum on a fixed-probability model, beam 1 equals greedy."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from glassformer.model import ModelConfig, Transformer
from glassformer.translation.decode import beam_search, greedy, length_normalized, output_limits, pad_batch
from glassformer.translation.tokenize import BOS, EOS, PAD


def _model(positions: str = "sinusoidal", seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig.tiny(src_vocab=40, tgt_vocab=30, positions=positions, norm_placement="post")
    model = Transformer(cfg).eval()
    with torch.no_grad():                       # sharper distributions: fewer near-ties, more EOS
        model.head.weight.mul_(4.0)
    return model


SOURCES = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [18]]


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "relative", "rope"])
def test_cached_logits_equal_full_forward(positions):
    model = _model(positions)
    src = pad_batch(SOURCES)
    out = greedy(model, src, max_len=8)
    tgt = pad_batch([[BOS] + o for o in out])                             # generated prefixes
    with torch.no_grad():
        full = model(src, tgt)                                            # (batch, tgt, vocab)
        memory = model.encode(src)
        cache = model.new_cache()
        steps = [model.decode_step(tgt[:, t: t + 1], memory, src == PAD, cache)[:, 0]
                 for t in range(tgt.size(1))]
    cached = torch.stack(steps, dim=1)
    for b, o in enumerate(out):                                           # rows up to each sentence's end
        n = len(o) + 1
        torch.testing.assert_close(cached[b, :n], full[b, :n], atol=1e-5, rtol=1e-5)


def test_greedy_matches_step_by_step_argmax_without_cache():
    model = _model()
    src = pad_batch(SOURCES[:1])
    out = greedy(model, src, max_len=6)[0]
    prefix = [BOS]
    with torch.no_grad():
        for _ in range(6):
            nxt = int(model(src, torch.tensor([prefix]))[0, -1].argmax())
            if nxt == EOS:
                break
            prefix.append(nxt)
    assert out == prefix[1:]


@pytest.mark.parametrize("beam", [1, 3])
def test_sentence_decodes_the_same_alone_and_in_a_batch(beam):
    model = _model()
    batch = pad_batch(SOURCES)
    limit = torch.tensor([len(s) + 4 for s in SOURCES])                   # per-sentence output limits

    def run(src, lim):
        return greedy(model, src, max_len=lim) if beam == 1 else beam_search(
            model, src, beam=beam, alpha=0.6, max_len=lim)

    together = run(batch, limit)
    for b, s in enumerate(SOURCES):
        single = run(pad_batch([s]), limit[b: b + 1])
        assert single[0] == together[b]
    assert any(len(t) > 0 for t in together)


def test_beam_one_is_greedy_without_length_penalty():
    model = _model()
    src = pad_batch(SOURCES)
    assert beam_search(model, src, beam=1, alpha=0.0, max_len=10) == greedy(model, src, max_len=10)


def test_output_limit_follows_source_length():
    pad = pad_batch([[5] * 7, [6]]) == PAD
    assert output_limits(pad, model_max_len=64, a=2.0, b=10).tolist() == [24, 12]
    assert output_limits(pad, model_max_len=20, a=2.0, b=10).tolist() == [20, 12]
    model = _model()
    out = greedy(model, pad_batch([[5]]), max_len=3)
    assert len(out[0]) <= 3


# ---- a model with fixed next-token probabilities ------------------------------------------
A, B, C = 4, 5, 6
VOCAB = 7


class _PrefixCache:
    """Remembers each row's generated prefix; reorder follows the beams like a KV cache."""

    def __init__(self) -> None:
        self.prefixes: list[tuple[int, ...]] | None = None

    def reorder(self, index: torch.Tensor) -> None:
        self.prefixes = [self.prefixes[i] for i in index.tolist()]


class TableModel:
    """encode/new_cache/decode_step over a hand-written table: P(next | prefix)."""

    def __init__(self, table) -> None:
        self.table = table
        self.cfg = ModelConfig.tiny(max_len=64)

    def encode(self, src, src_pad=None):
        return torch.zeros(src.size(0), src.size(1), 1)

    def new_cache(self):
        return _PrefixCache()

    def decode_step(self, tokens, memory, src_pad, cache):
        if cache.prefixes is None:
            cache.prefixes = [() for _ in range(tokens.size(0))]
        rows = []
        for r, t in enumerate(tokens[:, -1].tolist()):
            if t != BOS:
                cache.prefixes[r] = cache.prefixes[r] + (t,)
            probs = torch.zeros(VOCAB, dtype=torch.float64)
            for token, p in self.table(cache.prefixes[r]).items():
                probs[token] = p
            rows.append(torch.log(probs))
        return torch.stack(rows)[:, None, :]                              # (batch, 1, vocab)


def _designed(prefix):
    """Greedy takes A (0.5) and then wanders; the best sentence is B EOS (0.45 * 0.9)."""
    if prefix == ():
        return {A: 0.5, B: 0.45, EOS: 0.05}
    if prefix == (B,):
        return {EOS: 0.9, A: 0.1}
    if prefix[0] == A:
        return {A: 0.34, B: 0.33, EOS: 0.33}
    return {EOS: 0.5, C: 0.5}


def _random_table(seed):
    def table(prefix):
        g = torch.Generator().manual_seed(hash((seed, prefix)) % (2 ** 31))
        w = torch.rand(4, generator=g, dtype=torch.float64) ** 3 + 1e-3
        w = w / w.sum()
        return dict(zip((EOS, A, B, C), w.tolist(), strict=True))
    return table


def _exhaustive(table, limit, alpha):
    """Best sequence by score / len^alpha over every path: EOS at length <= limit, or cut at the limit."""
    best, best_seq = -math.inf, None
    for n in range(1, limit + 1):
        for body in itertools.product((A, B, C), repeat=n - 1):
            endings = [EOS] + ([A, B, C] if n == limit else [])
            for end in endings:
                seq = body + (end,)
                score, ok = 0.0, True
                for i, tok in enumerate(seq):
                    p = table(seq[:i]).get(tok, 0.0)
                    if p == 0:
                        ok = False
                        break
                    score += math.log(p)
                if ok and length_normalized(score, n, alpha) > best + 1e-12:
                    best, best_seq = length_normalized(score, n, alpha), [t for t in seq if t != EOS]
    return best_seq, best


def test_beam_search_beats_greedy_on_the_designed_table():
    model = TableModel(_designed)
    src = torch.tensor([[7, 8]])
    assert greedy(model, src, max_len=4)[0][0] == A
    assert beam_search(model, src, beam=2, alpha=0.0, max_len=4)[0] == [B]
    assert _exhaustive(_designed, 4, 0.0)[0] == [B]


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_wide_beam_finds_the_exhaustive_optimum(alpha, seed):
    table = _random_table(seed)
    model = TableModel(table)
    limit = 4
    expected, expected_score = _exhaustive(table, limit, alpha)
    hyp = beam_search(model, torch.tensor([[9, 9, 9]]), beam=128, alpha=alpha, max_len=limit, n_best=True)[0]
    assert hyp.tokens == expected
    assert hyp.normalized == pytest.approx(expected_score, abs=1e-9)


def test_length_penalty_keeps_searching_after_the_first_finished_beam():
    """With alpha = 1 a longer sentence wins: stopping at the first finished beam would return []."""

    def table(prefix):
        if prefix == ():
            return {EOS: 0.4, A: 0.6}
        if len(prefix) < 3:
            return {A: 0.7, EOS: 0.3}
        return {EOS: 0.99, A: 0.01}

    model = TableModel(table)
    src = torch.tensor([[9]])
    short = beam_search(model, src, beam=2, alpha=0.0, max_len=6)[0]
    longer = beam_search(model, src, beam=2, alpha=1.0, max_len=6)[0]
    assert short == []                                     # 0.4 beats 0.6 x .7 x .7 x .99 = 0.29 unnormalised
    assert longer == [A, A, A]                             # divided by its length it wins
    assert longer == _exhaustive(table, 6, 1.0)[0]
