"""Search: strategies that choose the next tokens, apart from the one loop that runs them.

As in fairseq (search.py beside sequence_generator.py), a strategy sees only numbers — each live
beam's log-probabilities over the vocabulary and its score so far — and returns ranked candidate
continuations `(scores, tokens, parents)`. `generate` owns everything else: the output limits, the
finished hypotheses and when a sentence is done, and the cache rows (beams follow their parents,
finished sentences leave the batch). `Greedy` is the same loop with one beam and one candidate.

The rules:
- Output limit per sentence: a·source_len + b generated tokens (EOS included), capped by the model's
  max_len; or a given limit, also capped by max_len.
- A hypothesis' score is the sum of its token log-probabilities; finished hypotheses rank by
  score / len^alpha, len counting the generated tokens including EOS.
- Each step, among the candidates ranked best first: EOS in the top K finishes a hypothesis (at the
  limit any token in the top K does); the best K that do not finish stay live.
- A sentence is done when no live beam can still beat its n-th best finished hypothesis: since
  log-probs are <= 0, a live beam with score s at length L reaches at best
  max(s / (L+1)^alpha, s / limit^alpha).
- Decoding starts from the model's `cfg.bos_id`, ends at `cfg.eos_id`, never produces `cfg.pad_id`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

LENGTH_A, LENGTH_B = 2.0, 10      # output limit: a * source_len + b tokens
DEFAULT_ALPHA = 1.0               # length penalty exponent (chosen on dev, docs/translator.md)


# ---- output limits ------------------------------------------------------------------------
def output_limits(src_pad: Tensor, model_max_len: int, a: float = LENGTH_A, b: int = LENGTH_B) -> Tensor:
    """Most tokens each sentence may generate (EOS included): a * source_len + b, at most max_len."""
    src_len = (~src_pad).sum(dim=1)                                          # (batch,)
    return torch.clamp((src_len.double() * a).long() + b, max=model_max_len)


def sentence_limits(src_pad: Tensor, model_max_len: int, max_len: int | Tensor | None = None) -> list[int]:
    """Each sentence's output limit: `output_limits`, or `max_len` (one for all, or one per sentence),
    always capped by the model's max_len."""
    if max_len is None:
        limits = output_limits(src_pad, model_max_len)
    elif isinstance(max_len, int):
        limits = torch.full((src_pad.size(0),), min(max_len, model_max_len), dtype=torch.long)
    else:
        limits = torch.clamp(max_len.long().cpu(), max=model_max_len)
    if len(limits) != src_pad.size(0) or bool((limits < 1).any()):
        raise ValueError(f"max_len: expected limits >= 1, one per sentence, got {limits.tolist()}")
    return limits.tolist()


# ---- strategies ---------------------------------------------------------------------------
class Greedy:
    """The most probable next token of each sentence: one beam, one candidate."""

    beam = 1

    def step(self, log_probs: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """log_probs (sent, 1, vocab), scores (sent, 1) -> scores, tokens, parents, each (sent, 1)."""
        best, tokens = (scores[:, :, None] + log_probs).max(dim=-1)          # (sent, 1)
        return best, tokens, torch.zeros_like(tokens)


class BeamSearch:
    """K beams per sentence: the 2K best continuations of all K beams, so that K of them can stay live
    even when up to K others end with EOS."""

    def __init__(self, beam: int) -> None:
        if beam < 1:
            raise ValueError(f"beam must be >= 1, got {beam}")
        self.beam = beam

    def step(self, log_probs: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """log_probs (sent, K, vocab), scores (sent, K) -> scores, tokens, parents (beam index in [0, K)),
        each (sent, 2K), best first."""
        n, K, V = log_probs.shape
        flat = (scores[:, :, None] + log_probs).view(n, K * V)               # (sent, K*vocab)
        best, index = flat.topk(min(2 * K, K * V), dim=-1)                   # (sent, 2K)
        return best, index % V, index // V


def strategy(beam: int) -> Greedy | BeamSearch:
    """Greedy for beam 1, beam search otherwise."""
    return Greedy() if beam == 1 else BeamSearch(beam)


# ---- finished hypotheses ------------------------------------------------------------------
@dataclass
class Hypothesis:
    """A finished beam: generated ids (EOS excluded), summed log-prob, its length-penalised score, and
    whether it ended with EOS (False: cut at the output limit)."""

    tokens: list[int]
    score: float
    normalized: float
    finished: bool = True


def length_normalized(score: float, length: int, alpha: float) -> float:
    """score / length^alpha; length counts generated tokens including EOS."""
    return score / (length ** alpha)


def _best_possible(score: float, length: int, limit: int, alpha: float) -> float:
    """Upper bound of the normalised score a live beam (score, length so far) can still reach."""
    if score == -math.inf:
        return -math.inf
    nearest = min(length + 1, limit)
    return max(length_normalized(score, nearest, alpha), length_normalized(score, limit, alpha))


class _Finished:
    """One sentence's n best finished hypotheses, best first (the earlier one first among equals)."""

    def __init__(self, n: int) -> None:
        self.n, self.best = n, []

    def add(self, hyp: Hypothesis) -> None:
        self.best.append(hyp)
        self.best.sort(key=lambda h: -h.normalized)                          # stable: earlier wins ties
        del self.best[self.n:]

    def beats(self, bound: float) -> bool:
        """True when n hypotheses are in and no live beam reaching at most `bound` can enter them."""
        return len(self.best) == self.n and bound <= self.best[-1].normalized

    def result(self) -> list[Hypothesis]:
        return self.best or [Hypothesis([], -math.inf, -math.inf, False)]


# ---- the loop -----------------------------------------------------------------------------
@dataclass
class _Live:
    score: float
    parent: int        # row of the beam it continues
    token: int


class _Beams:
    """The live beams of the sentences still decoding: K rows per sentence, their ids and scores."""

    def __init__(self, n_sent: int, K: int, limits: list[int], n_best: int, alpha: float, eos: int) -> None:
        self.K, self.limits, self.alpha, self.eos = K, limits, alpha, eos
        self.alive = list(range(n_sent))                                     # sentences still decoding
        self.seqs: list[list[int]] = [[] for _ in range(n_sent * K)]         # ids generated, per row
        scores = torch.full((n_sent, K), -math.inf, dtype=torch.float64)
        scores[:, 0] = 0.0                                                   # one live beam at the start
        self.scores = scores                                                 # (alive, K)
        self.tokens: list[int] = []                                          # the newest id of each row
        self.finished = [_Finished(n_best) for _ in range(n_sent)]

    def advance(self, scores: Tensor, tokens: Tensor, parents: Tensor, length: int) -> list[int]:
        """Take one step's ranked candidates, each (alive, C); return the rows the next step continues
        (empty when every sentence is done)."""
        rows: list[_Live] = []
        still: list[int] = []
        ranked = zip(scores.tolist(), tokens.tolist(), parents.tolist(), strict=True)
        for j, (b, (s, t, p)) in enumerate(zip(self.alive, ranked, strict=True)):
            candidates = [_Live(score, j * self.K + parent, token)        # parent: a row of this step
                          for score, token, parent in zip(s, t, p, strict=True)]
            live = self._split(b, candidates, length)
            if self._done(b, live, length):
                continue                                                     # sentence b leaves the batch
            still.append(b)
            live += [_Live(-math.inf, live[0].parent, live[0].token)] * (self.K - len(live))  # dead copies
            rows += live
        self.seqs = [self.seqs[r.parent] + [r.token] for r in rows]
        self.tokens = [r.token for r in rows]
        self.scores = torch.tensor([r.score for r in rows], dtype=torch.float64).view(len(still), self.K)
        self.alive = still
        return [r.parent for r in rows]

    def _split(self, b: int, candidates: list[_Live], length: int) -> list[_Live]:
        """Sentence b's candidates, best first: record those that finish (only the top K may), return the
        best K that stay live."""
        limit, live = self.limits[b], []
        for rank, c in enumerate(candidates):
            if c.score == -math.inf:
                break
            if c.token == self.eos or length >= limit:
                if rank < self.K:
                    ids = self.seqs[c.parent] + ([] if c.token == self.eos else [c.token])
                    self.finished[b].add(Hypothesis(ids, c.score, length_normalized(c.score, length, self.alpha),
                                                    finished=c.token == self.eos))
            elif len(live) < self.K:
                live.append(c)
        return live

    def _done(self, b: int, live: list[_Live], length: int) -> bool:
        """At the limit, with no live beam, or when no live beam can still beat the finished ones."""
        limit = self.limits[b]
        bound = max((_best_possible(c.score, length, limit, self.alpha) for c in live), default=-math.inf)
        return length >= limit or not live or self.finished[b].beats(bound)


def _log_probs(logits: Tensor, pad_id: int) -> Tensor:
    """Next-token log-probabilities in float64 on the CPU, PAD never chosen (its log-prob -inf; the
    others keep their values)."""
    log_probs = F.log_softmax(logits.double(), dim=-1).cpu()
    log_probs[..., pad_id] = -math.inf
    return log_probs


class _CachedRun:
    """The model's own incremental decoding as a run: `decode_step` through its KV cache, float64
    log-probabilities, the strategy's choice. (inference.StaticDecoder gives runs with the same two
    methods, over one static, compilable step.)"""

    def __init__(self, model, memory: Tensor, src_pad: Tensor, search: Greedy | BeamSearch) -> None:
        self.model, self.memory, self.src_pad, self.search = model, memory, src_pad, search
        self.cache = model.new_cache()

    def step(self, tokens: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """tokens (rows, 1), scores (sent, K) -> ranked candidates: scores, tokens, parents (sent, C)."""
        logits = self.model.decode_step(tokens, self.memory, self.src_pad, self.cache)[:, -1]  # (rows, vocab)
        log_probs = _log_probs(logits, self.model.cfg.pad_id).view(scores.size(0), scores.size(1), -1)
        return self.search.step(log_probs, scores)

    def keep(self, index: Tensor, same_source: bool) -> None:
        """Keep rows `index`: beams follow their parents; without same_source, sentences left."""
        self.cache.reorder(index, same_source=same_source)
        if not same_source:                                                  # a sentence's beams share a source
            self.memory, self.src_pad = self.memory[index], self.src_pad[index]


@torch.no_grad()
def generate(model, src: Tensor, search: Greedy | BeamSearch, src_pad: Tensor | None = None,
             alpha: float = DEFAULT_ALPHA, max_len: int | Tensor | None = None,
             n_best: int = 1) -> list[list[Hypothesis]]:
    """The n_best hypotheses of each sentence of a batch, best first (n_best <= the beam).

    `model` is anything with the decoding API: cfg, encode, and either `start(memory, src_pad, search)`
    (a run with `step` and `keep`, inference.StaticDecoder) or new_cache and decode_step (the model, its
    prepared copy: `_CachedRun`). The K beams of a sentence share its source rows: cross-attention's K/V,
    `memory` and `src_pad` are re-indexed only when a sentence leaves, and nothing is when every row
    continues itself (greedy until a sentence ends).
    """
    K = search.beam
    if not 1 <= n_best <= K:
        raise ValueError(f"n_best must be in [1, beam={K}], got {n_best}")
    cfg = model.cfg
    src_pad = src == cfg.pad_id if src_pad is None else src_pad
    beams = _Beams(src.size(0), K, sentence_limits(src_pad, cfg.max_len, max_len), n_best, alpha, cfg.eos_id)
    if not beams.alive:
        return []
    memory = model.encode(src, src_pad)                                      # (batch, src, d)
    rows = torch.arange(src.size(0), device=src.device).repeat_interleave(K)  # (batch*K,)
    memory, src_pad = memory[rows], src_pad[rows]                            # (batch*K, src, d)
    start = getattr(model, "start", None)
    run = start(memory, src_pad, search) if start is not None else _CachedRun(model, memory, src_pad, search)
    tokens = torch.full((src.size(0) * K, 1), cfg.bos_id, dtype=torch.long, device=src.device)
    for length in itertools.count(1):                                        # tokens generated so far
        n_rows = len(tokens)
        index = beams.advance(*run.step(tokens, beams.scores), length)
        if not index:
            break
        left = len(index) < n_rows                                           # a sentence left the batch
        if left or index != list(range(n_rows)):                             # else every row continues itself
            run.keep(torch.tensor(index, device=src.device), same_source=not left)   # beams follow their parents
        tokens = torch.tensor(beams.tokens, dtype=torch.long, device=src.device)[:, None]
    return [f.result() for f in beams.finished]


# ---- the common calls ---------------------------------------------------------------------
def greedy(model, src: Tensor, src_pad: Tensor | None = None, max_len: int | Tensor | None = None
           ) -> list[list[int]]:
    """Most probable next token at every step, for a batch of sentences; ids without BOS/EOS."""
    return [hyps[0].tokens for hyps in generate(model, src, Greedy(), src_pad, max_len=max_len)]


def beam_search(model, src: Tensor, src_pad: Tensor | None = None, beam: int = 4,
                alpha: float = DEFAULT_ALPHA, max_len: int | Tensor | None = None) -> list[list[int]]:
    """The best hypothesis of K beams per sentence; ids without BOS/EOS. With alpha = 0 and K = 1 this is
    greedy."""
    return [hyps[0].tokens for hyps in generate(model, src, BeamSearch(beam), src_pad, alpha, max_len)]
