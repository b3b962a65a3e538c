"""Decoding: a batch in which sentences end at different steps decodes each sentence as it decodes
alone (greedy and beam, through the model's cache); greedy equals an independent argmax walk that
stops at the first EOS; the special ids come from the model; beam search finds the exhaustive optimum
(and the n best) of a fixed-probability model, scored with the test's own length penalty."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from glassformer.decoding.search import (
    BeamSearch,
    Greedy,
    beam_search,
    generate,
    greedy,
    output_limits,
)
from glassformer.model import ModelConfig, Transformer


def pad(sequences, pad_id: int = 0) -> torch.Tensor:
    return pad_sequence([torch.tensor(s, dtype=torch.long) for s in sequences], batch_first=True,
                        padding_value=pad_id)


def seeded(cfg: ModelConfig, seed: int, sharpen: float = 4.0) -> Transformer:
    """A model whose weights come from `seed` by parameter name (not by construction order); the head
    sharpened so that distributions are peaked (few near-ties)."""
    model = Transformer(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() == 1 and "norm" in name:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.size(1) ** 0.5)
        model.head.weight.mul_(sharpen)
    return model


def _model(positions: str = "sinusoidal", seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig.tiny(src_vocab=40, tgt_vocab=30, positions=positions, norm_placement="post")
    model = Transformer(cfg).eval()
    with torch.no_grad():                       # sharper distributions: fewer near-ties
        model.head.weight.mul_(4.0)
    return model


SOURCES = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [18], [19, 20, 21, 22, 23], [24, 25, 26]]
LIMIT = 12


def ending_model() -> Transformer:
    """A tiny model that ends sentences at different steps: EOS wins a row exactly when the row's best
    other token has an id = 1 (mod 4); else EOS and PAD cannot be chosen. A function of each row alone,
    so it acts the same in a batch, alone, stepped through the cache or in a full forward."""
    cfg = ModelConfig.tiny(src_vocab=40, tgt_vocab=30, tie_target=False)
    model = seeded(cfg, 0)

    def ending(logits, name):
        v = logits.clone()
        v[..., cfg.eos_id] = v[..., cfg.pad_id] = -math.inf
        top, winner = v.max(dim=-1)
        v[..., cfg.eos_id] = torch.where(winner % 4 == 1, top + 1.0, -math.inf)
        return v

    model.ending = ending
    return model


def argmax_walk(model, source: list[int], limit: int) -> list[int]:
    """Greedy written out: a full forward over BOS + the prefix at each step (no cache), the most
    probable token other than PAD, stop at the first EOS or after `limit` tokens."""
    cfg = model.cfg
    src = torch.tensor([source])
    prefix: list[int] = []
    with torch.no_grad():
        for _ in range(limit):
            logits = model(src, torch.tensor([[cfg.bos_id, *prefix]]))[0, -1]    # (vocab,)
            logits[cfg.pad_id] = -math.inf
            token = int(logits.argmax())
            if token == cfg.eos_id:
                break
            prefix.append(token)
    return prefix


# ---- sentences that end at different steps ------------------------------------------------
@pytest.mark.parametrize("search, alpha", [(Greedy(), 1.0), (BeamSearch(3), 0.6), (BeamSearch(3), 1.0),
                                           (BeamSearch(4), 0.0)])
def test_a_batch_decodes_each_sentence_as_it_decodes_alone(search, alpha):
    model = ending_model()
    with model.intervene({"logits": model.ending}):
        together = generate(model, pad(SOURCES), search, alpha=alpha, max_len=LIMIT)
        alone = [generate(model, pad([s]), search, alpha=alpha, max_len=LIMIT)[0] for s in SOURCES]
    ends = [len(h[0].tokens) for h in together if h[0].finished]
    assert len(set(ends)) >= 3, f"premise: sentences should end at different steps, got {ends}"
    assert any(not h[0].finished and len(h[0].tokens) == LIMIT for h in together), "premise: one runs to the limit"
    for b, (batched, single) in enumerate(zip(together, alone, strict=True)):
        assert batched[0].tokens == single[0].tokens, f"sentence {b}"
        assert batched[0].finished == single[0].finished
        # float32 logits of a batch and of one row round differently (the kernels block by rows): ~1e-6 a token
        assert batched[0].score == pytest.approx(single[0].score, rel=1e-5, abs=1e-5), f"sentence {b}"


def test_greedy_equals_an_independent_argmax_walk_that_stops_at_the_first_eos():
    model = ending_model()
    with model.intervene({"logits": model.ending}):
        batched = greedy(model, pad(SOURCES), max_len=LIMIT)
        walks = [argmax_walk(model, s, LIMIT) for s in SOURCES]
    assert batched == walks
    assert len({len(w) for w in walks if len(w) < LIMIT}) >= 3             # premise: different end steps
    assert all(model.cfg.eos_id not in w for w in batched)


def test_greedy_is_the_prefix_of_a_longer_greedy_and_respects_each_limit():
    model = ending_model()
    limits = torch.tensor([3, 1, 12, 2, 5, 4])
    with model.intervene({"logits": model.ending}):
        full = greedy(model, pad(SOURCES), max_len=LIMIT)
        cut = greedy(model, pad(SOURCES), max_len=limits)
    for f, c, n in zip(full, cut, limits.tolist(), strict=True):
        assert c == f[:n]                                                    # EOS counts: n tokens at most


def test_special_ids_come_from_the_model():
    """Marian's layout: EOS 0, PAD the last id, the decoder starts from PAD; PAD is never generated even
    where it is the most probable token."""
    cfg = ModelConfig.tiny(src_vocab=40, tgt_vocab=30, tie_target=False, head_bias=True, pad_id=29, bos_id=29,
                           eos_id=0)
    model = seeded(cfg, 1)
    with torch.no_grad():
        model.head.bias[cfg.pad_id] = 100.0                                 # PAD would win every step
    sources = [[5, 6, 7], [8, 9, 10, 11, 12]]
    src = pad(sources, cfg.pad_id)
    with torch.no_grad():
        first = model(src[:1], torch.tensor([[cfg.bos_id]]))[0, -1]
    assert int(first.argmax()) == cfg.pad_id                                 # premise
    out = greedy(model, src, max_len=8)
    assert out == [argmax_walk(model, s, 8) for s in sources]
    assert all(cfg.pad_id not in o for o in out)
    beams = generate(model, src, BeamSearch(3), max_len=8, n_best=3)
    assert all(cfg.pad_id not in h.tokens for hyps in beams for h in hyps)


def test_n_best_returns_n_distinct_hypotheses_best_first():
    model = ending_model()
    with model.intervene({"logits": model.ending}):
        hyps = generate(model, pad(SOURCES), BeamSearch(4), alpha=1.0, max_len=LIMIT, n_best=3)
        one = generate(model, pad(SOURCES), BeamSearch(4), alpha=1.0, max_len=LIMIT)
    for h, o in zip(hyps, one, strict=True):
        assert len(h) == 3 and len({tuple(x.tokens) for x in h}) == 3
        assert [x.normalized for x in h] == sorted((x.normalized for x in h), reverse=True)
        assert h[0].tokens == o[0].tokens
    with pytest.raises(ValueError, match="n_best"):
        generate(model, pad(SOURCES), BeamSearch(2), n_best=3)


# ---- the model's own cache ------------------------------------------------------------------
@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "relative", "rope"])
def test_cached_logits_equal_full_forward(positions):
    model = _model(positions)
    cfg = model.cfg
    src = pad(SOURCES)
    out = greedy(model, src, max_len=8)
    tgt = pad([[cfg.bos_id] + o for o in out])                              # generated prefixes
    with torch.no_grad():
        full = model(src, tgt)                                               # (batch, tgt, vocab)
        memory = model.encode(src)
        cache = model.new_cache()
        steps = [model.decode_step(tgt[:, t: t + 1], memory, src == cfg.pad_id, cache)[:, 0]
                 for t in range(tgt.size(1))]
    cached = torch.stack(steps, dim=1)
    for b, o in enumerate(out):                                              # rows up to each sentence's end
        n = len(o) + 1
        torch.testing.assert_close(cached[b, :n], full[b, :n], atol=1e-5, rtol=1e-5)


def test_beam_one_is_greedy_without_length_penalty():
    model = ending_model()
    with model.intervene({"logits": model.ending}):
        assert beam_search(model, pad(SOURCES), beam=1, alpha=0.0, max_len=10) == \
            greedy(model, pad(SOURCES), max_len=10)


def test_output_limit_follows_source_length():
    src_pad = pad([[5] * 7, [6]]) == 0
    assert output_limits(src_pad, model_max_len=64, a=2.0, b=10).tolist() == [24, 12]
    assert output_limits(src_pad, model_max_len=20, a=2.0, b=10).tolist() == [20, 12]
    model = _model()
    out = greedy(model, pad([[5]]), max_len=3)
    assert len(out[0]) <= 3


# ---- a model with fixed next-token probabilities ------------------------------------------
A, B, C = 4, 5, 6
VOCAB = 7
BOS, EOS = 1, 2                  # ModelConfig's default ids, used by TableModel's config


def penalised(score: float, length: int, alpha: float) -> float:
    """The test's own length penalty (the convention of docs/translator.md): summed log-prob divided by
    length^alpha, the length counting every generated token including EOS."""
    return score / math.pow(length, alpha)


class _PrefixCache:
    """Remembers each row's generated prefix; reorder follows the beams like a KV cache."""

    def __init__(self) -> None:
        self.prefixes: list[tuple[int, ...]] | None = None

    def reorder(self, index: torch.Tensor, *, same_source: bool = False) -> None:
        self.prefixes = [self.prefixes[i] for i in index.tolist()]


class TableModel:
    """encode/new_cache/decode_step over a hand-written table: P(next | prefix)."""

    def __init__(self, table) -> None:
        self.table = table
        self.cfg = ModelConfig.tiny(max_len=64, tgt_vocab=VOCAB)

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


def _every_path(table, limit, alpha):
    """(penalised score, ids without EOS) of every path: EOS at length <= limit, or cut at the limit; best first."""
    paths = []
    for n in range(1, limit + 1):
        for body in itertools.product((A, B, C), repeat=n - 1):
            for end in [EOS] + ([A, B, C] if n == limit else []):
                seq = body + (end,)
                probs = [table(seq[:i]).get(tok, 0.0) for i, tok in enumerate(seq)]
                if all(p > 0 for p in probs):
                    score = sum(math.log(p) for p in probs)
                    paths.append((penalised(score, n, alpha), [t for t in seq if t != EOS]))
    return sorted(paths, key=lambda p: -p[0])


def test_beam_search_beats_greedy_on_the_designed_table():
    model = TableModel(_designed)
    src = torch.tensor([[3, 3]])
    assert greedy(model, src, max_len=4)[0][0] == A
    assert beam_search(model, src, beam=2, alpha=0.0, max_len=4)[0] == [B]
    assert _every_path(_designed, 4, 0.0)[0][1] == [B]


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_wide_beam_finds_the_exhaustive_n_best(alpha, seed):
    table = _random_table(seed)
    model = TableModel(table)
    limit = 4
    expected = _every_path(table, limit, alpha)[:3]
    hyps = generate(model, torch.tensor([[3, 3, 3]]), BeamSearch(128), alpha=alpha, max_len=limit, n_best=3)[0]
    assert [h.tokens for h in hyps] == [ids for _, ids in expected]
    assert [h.normalized for h in hyps] == pytest.approx([s for s, _ in expected], abs=1e-9)


def test_length_penalty_keeps_searching_after_the_first_finished_beam():
    """With alpha = 1 a longer sentence wins: stopping at the first finished beam would return []."""

    def table(prefix):
        if prefix == ():
            return {EOS: 0.4, A: 0.6}
        if len(prefix) < 3:
            return {A: 0.7, EOS: 0.3}
        return {EOS: 0.99, A: 0.01}

    model = TableModel(table)
    src = torch.tensor([[3]])
    short = beam_search(model, src, beam=2, alpha=0.0, max_len=6)[0]
    longer = beam_search(model, src, beam=2, alpha=1.0, max_len=6)[0]
    assert short == []                                     # 0.4 beats 0.6 x .7 x .7 x .99 = 0.29 unnormalised
    assert longer == [A, A, A]                             # divided by its length (4, EOS counted) it wins
    assert penalised(math.log(0.6 * 0.7 * 0.7 * 0.99), 4, 1.0) > penalised(math.log(0.4), 1, 1.0)
    assert longer == _every_path(table, 6, 1.0)[0][1]


def test_one_beam_search_keeps_its_second_candidate_live_after_the_first_ends():
    """BeamSearch(1) ranks 2 candidates: EOS on top finishes a hypothesis while the runner-up stays live, and the
    longer sentence it reaches wins with alpha = 1 (greedy, one candidate, stops at the first EOS)."""

    def table(prefix):
        if prefix == ():
            return {EOS: 0.5, A: 0.45, B: 0.05}
        if prefix == (A,):
            return {A: 0.95, EOS: 0.05}
        return {EOS: 0.99, B: 0.01}

    model, src = TableModel(table), torch.tensor([[3]])
    assert greedy(model, src, max_len=6)[0] == []
    assert beam_search(model, src, beam=1, alpha=1.0, max_len=6)[0] == [A, A]
    assert penalised(math.log(0.45 * 0.95 * 0.99), 3, 1.0) > penalised(math.log(0.5), 1, 1.0)


# ---- the best n of a row ----------------------------------------------------------------------
@pytest.mark.parametrize("vocab", [4000, 4001, 1100, 200])
def test_best_continuations_are_the_best_of_every_beam_and_token(vocab):
    """Each sentence's 2K best of score + log_softmax(logits) over all its beams and tokens, PAD never: against
    a brute-force sort of the whole (K x vocab) table in float64; with the best continuations all in one beam,
    in one block, the best of a sentence in the last (short) block, a dead beam (score -inf), PAD far above every
    other logit (the normaliser's shift is the row's largest logit, PAD's included), and both ways (blocks, or one
    topk for a small vocabulary)."""
    from glassformer.decoding.candidates import TOP_BLOCK, best_continuations

    g = torch.Generator().manual_seed(vocab)
    sent, K, pad = 3, 4, 0
    logits = torch.randn(sent * K, vocab, generator=g) * 3
    logits[0, pad] = 100.0                                                   # PAD, the best logit: never chosen
    logits[5, 40:48] = 30.0 + torch.arange(8.0) / 8                          # sentence 1: all 8 best in beam 1
    scores = -torch.rand(sent, K, generator=g, dtype=torch.float64) * 5
    scores[1] = torch.tensor([-20.0, 0.0, -20.0, -20.0], dtype=torch.float64)  # (beam 1 far ahead)
    scores[2, 1:] = -math.inf                                                # sentence 2: one live beam
    logits[8, -1] = 60.0                                                     # sentence 2: its best, the last id,
    logits[8, pad] = 200.0                                                   # and PAD 140 above it: exp(140) in float32
    best, tokens, parents = best_continuations(logits, scores, pad, 2 * K)
    table = scores[:, :, None] + torch.log_softmax(logits.double(), dim=-1).view(sent, K, vocab)
    table[:, :, pad] = -math.inf
    want, at = table.view(sent, -1).topk(2 * K)
    assert torch.allclose(best, want, rtol=0, atol=1e-5)                    # float32 exponentials
    assert torch.equal(tokens, at % vocab) and torch.equal(parents, at // vocab)
    assert parents[1].tolist() == [1] * 8 and tokens[1].tolist() == list(range(47, 39, -1))
    assert (parents[2] == 0).all() and (tokens != pad).all() and tokens[2, 0] == vocab - 1
    assert (vocab >= 4 * 2 * K * TOP_BLOCK) == (vocab != 200)                # both ways are tested


def test_most_probable_is_the_best_non_pad_token_and_its_log_probability():
    """Greedy's choice: argmax over all but PAD (the first of equals), its log_softmax in float64 (to the
    rounding of float32 exponentials; exact for float64 logits)."""
    from glassformer.decoding.candidates import most_probable

    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(1))
    logits[0, 0] = 50.0                                                      # PAD the best: the next one wins
    logits[1, 7] = logits[1, 9] = 40.0                                       # equals: the first id
    log_probs, tokens = most_probable(logits, pad_id=0)
    want = torch.log_softmax(logits.double(), dim=-1)
    want[:, 0] = -math.inf
    assert tokens[:, 0].tolist()[1] == 7 and tokens[0, 0] == want[0].argmax() != 0
    assert torch.equal(tokens[:, 0], want.argmax(dim=-1))
    assert torch.allclose(log_probs[:, 0], want.max(dim=-1).values, rtol=0, atol=1e-5)
    exact, _ = most_probable(logits.double(), pad_id=0)
    assert torch.allclose(exact[:, 0], want.max(dim=-1).values, rtol=0, atol=1e-12)


@pytest.mark.parametrize("pad_id", [0, 150, 299])
def test_the_traced_greedy_choice_is_the_eager_one_wherever_pad_lies(pad_id, monkeypatch):
    """The formula a compiled step traces (slices around PAD, the largest logit from the best and PAD's) gives
    the eager choice: PAD the largest logit, equal logits (the first id), PAD first, in the middle or last."""
    from glassformer.decoding.candidates import most_probable

    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(2))
    logits[0, pad_id] = 100.0                                                # PAD the best: exp(100 - 3) overflows
    logits[1, 7] = logits[1, 290] = 40.0                                     # equals: the first id
    logits[2, 299 if pad_id != 299 else 298] = 30.0                          # the best at the end
    logits[3, 1 if pad_id != 1 else 2] = 30.0                                # and near the start
    eager = most_probable(logits, pad_id)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    traced = most_probable(logits, pad_id)
    assert torch.equal(traced[1], eager[1]) and traced[1][1, 0] == 7 and (traced[1] != pad_id).all()
    assert torch.allclose(traced[0], eager[0], rtol=0, atol=1e-5) and torch.isfinite(traced[0]).all()
    ids_only = most_probable(logits, pad_id, normalise=False)                # the same choice, no normaliser
    assert ids_only[0] is None and torch.equal(ids_only[1], eager[1])
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    assert most_probable(logits, pad_id, normalise=False)[0] is None
    assert torch.equal(most_probable(logits, pad_id, normalise=False)[1], eager[1])


def test_the_exported_greedy_choice_reads_its_ids_from_a_constant_table():
    """A compiled step's choice takes the token ids from one constant (vocab,) table of the graph, not from an
    `arange` computed in it (built anew in every vector of the kernel's loop, twice the time): exported twice (a
    second trace reuses nothing of the first), each graph holds the table as data and still picks the first best."""
    from glassformer.decoding.candidates import most_probable

    class Choice(torch.nn.Module):
        def forward(self, logits):
            return most_probable(logits, 3, normalise=False)[1]

    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    logits[1, 20] = logits[1, 30] = 9.0                                      # equals: the first id
    logits[2, 3] = 9.0                                                       # PAD the largest: never chosen
    want = torch.where(torch.arange(50) == 3, -math.inf, logits).argmax(dim=-1)
    for _ in range(2):
        with torch.no_grad():
            program = torch.export.export(Choice(), (logits,))
        ops = {str(node.target) for node in program.graph.nodes}
        tables = [t for t in program.constants.values() if isinstance(t, torch.Tensor)]
        assert not any("arange" in op for op in ops), ops
        assert len(tables) == 1 and torch.equal(tables[0], torch.arange(50, dtype=torch.float32))
        assert torch.equal(program.module()(logits)[:, 0], want) and want[1] == 20


def test_stop_top_ends_when_a_steps_best_candidate_finishes_and_can_cut_a_better_beam():
    """stop="top" (OpenNMT-py / CTranslate2): EOS is the best candidate of the first step, so the search ends
    there with []; the default bound keeps searching and finds A EOS, better once divided by its length."""

    def table(prefix):
        return {EOS: 0.45, A: 0.40, B: 0.15} if prefix == () else {EOS: 0.99, A: 0.01}

    model = TableModel(table)
    src = torch.tensor([[3]])
    assert penalised(math.log(0.40 * 0.99), 2, 1.0) > penalised(math.log(0.45), 1, 1.0)   # premise
    top = generate(model, src, BeamSearch(2), alpha=1.0, max_len=6, stop="top")[0][0]
    bound = generate(model, src, BeamSearch(2), alpha=1.0, max_len=6)[0][0]
    assert top.tokens == [] and bound.tokens == [A] == _every_path(table, 6, 1.0)[0][1]
    with pytest.raises(ValueError, match="stop"):
        generate(model, src, BeamSearch(2), stop="first")


def test_stop_full_ends_once_k_hypotheses_have_finished():
    """stop="full" (fairseq; CTranslate2 with a length penalty): with K = 2, [] ends at step 1 and [B] at step 2,
    so the search ends there with []; the bound sees that the live A C can still win once divided by its
    length, and finds A C EOS, the optimum."""

    def table(prefix):
        return {(): {EOS: 0.5, A: 0.3, B: 0.2}, (A,): {EOS: 0.1, C: 0.9}, (B,): {EOS: 0.9, C: 0.1}}.get(
            prefix, {EOS: 0.99, A: 0.01})

    model = TableModel(table)
    src = torch.tensor([[3]])
    full = generate(model, src, BeamSearch(2), alpha=1.0, max_len=6, stop="full", n_best=2)[0]
    bound = generate(model, src, BeamSearch(2), alpha=1.0, max_len=6)[0][0]
    assert [h.tokens for h in full] == [[], [B]]
    assert bound.tokens == [A, C] == _every_path(table, 6, 1.0)[0][1]
    top = generate(model, src, BeamSearch(2), alpha=1.0, max_len=6, stop="top")[0][0]
    assert top.tokens == []                                                  # step 1's best candidate was EOS
