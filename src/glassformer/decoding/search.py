"""Search: strategies that choose the next tokens, apart from the one loop that runs them.

As in fairseq (search.py beside sequence_generator.py), a strategy sees only numbers — each live
beam's log-probabilities over the vocabulary and its score so far — and ranks candidate continuations
`(scores, tokens, parents)`; `Search.advance` then decides, in tensors, which of them finish a hypothesis
and which K stay live. `generate` owns the loop: the output limits, the finished hypotheses and when a
sentence is done, and the rows (beams follow their parents, finished sentences leave the batch).
`Greedy` is the same loop with one beam and one candidate.

The rules:
- Output limit per sentence: a·source_len + b generated tokens (EOS included), capped by the model's
  max_len; or a given limit, also capped by max_len.
- A hypothesis' score is the sum of its token log-probabilities (float64); finished hypotheses rank by
  score / len^alpha, len counting the generated tokens including EOS.
- Each step, among the candidates ranked best first: EOS in the top K finishes a hypothesis (at the
  limit any token in the top K does); the best K that do not finish stay live.
- A sentence is done when no live beam can still beat its n-th best finished hypothesis: since
  log-probs are <= 0, a live beam with score s at length L reaches at best
  max(s / (L+1)^alpha, s / limit^alpha) (stop="bound", the default: the search's own optimum). Two
  rules of other systems also end it earlier, with fewer steps and sometimes a worse translation (a longer
  beam that would have won is cut): stop="full", once K hypotheses have finished (fairseq's, and
  CTranslate2's whenever a length penalty is set); stop="top", once the best candidate of a step has ended
  a hypothesis and n are in (OpenNMT-py's, and CTranslate2's without a length penalty).
- Decoding starts from the model's `cfg.bos_id`, ends at `cfg.eos_id`, never produces `cfg.pad_id`.

One step costs the loop one look at the host: `Advance.events`, true when a hypothesis finished or a
sentence is done. Everything else stays in tensors, so one function, `step` (the model's `decode_step`,
then `Search.advance`), runs as it is or compiled into one graph (inference/compiler.py); `steps`, k of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from .candidates import best_continuations, most_probable
from .choices import DEFAULT_STOP, STOP_RULES  # noqa: F401 (search's API: when a beam search is done, docstring above)
from .hypotheses import Finished, Hypothesis
from .joining import Waiting
from .sizes import SENTENCE_BUCKETS, bucket, output_limits, sentence_limits  # noqa: F401 (search's API)

DEFAULT_ALPHA = 1.0               # length penalty exponent (chosen on dev, docs/translator.md)


# ---- scores -------------------------------------------------------------------------------
def length_normalized(score: float, length: int, alpha: float) -> float:
    """score / length^alpha; length counts generated tokens including EOS."""
    return score / (length ** alpha)


def best_possible(scores: Tensor, length: Tensor, limits: Tensor, alpha: Tensor) -> Tensor:
    """The best normalised score live beams (scores (sent, K), `length` tokens so far) can still reach
    within their sentence's limit (sent, 1): max(s / (L+1)^alpha, s / limit^alpha); -inf stays -inf."""
    nearest = torch.minimum(length + 1, limits).double()
    return torch.maximum(scores / nearest ** alpha, scores / limits.double() ** alpha)


# ---- one step, in tensors -----------------------------------------------------------------
class Slots(NamedTuple):
    """The loop's state, one slot per sentence (K rows each), all tensors: a compiled step takes them as they are.

    A slot whose sentence is done, or a padding slot, has `live` False and every score -inf: its rows
    still compute (until the batch shrinks) but can never finish or continue anything."""

    tokens: Tensor      # (slots*K,) each row's newest id (BOS at the start)
    scores: Tensor      # (slots, K) float64: each live beam's summed log-prob, -inf for a dead beam
    limits: Tensor      # (slots,) most tokens the sentence may generate
    live: Tensor        # (slots,) bool: the sentence is still decoding
    worst: Tensor       # (slots,) float64: the n-th best finished hypothesis' normalised score, -inf until n
    history: Tensor     # (slots*K, longest limit) the ids each row generated so far


class Advance(NamedTuple):
    """What one step decided for every slot (tensors). `rows` and `scores` are the next step's beams."""

    tokens: Tensor      # (slots*K,) the live beams' newest ids
    rows: Tensor        # (slots*K,) the row of this step each live beam continues
    scores: Tensor      # (slots, K) their scores (-inf: a dead copy, only filling the slot)
    history: Tensor     # (slots*K, longest limit) their ids, the newest included
    ranked: Tensor      # (slots, C) float64: the step's candidates, best first: their scores,
    ranked_tokens: Tensor   # (slots, C) their ids,
    ranked_parents: Tensor  # (slots, C) and the beam in [0, K) each continues
    ended: Tensor       # (slots, C) bool: candidates that finish a hypothesis (EOS, or the limit; top K only)
    bound: Tensor       # (slots,) float64: the best normalised score a live beam can still reach
    done: Tensor        # (slots,) bool: done whatever this step's finished hypotheses add
    events: Tensor      # () bool: something ended or is done; the one value the loop reads each step


class Search:
    """What every strategy shares: `advance`, the split of its ranked candidates into finished and live.

    A strategy's `rank` turns next-token logits and the beams' scores into each sentence's candidates, best
    first (decoding/candidates.py: no sort of a (rows, vocab) table)."""

    beam, kind = 1, "beam1"     # K beams; the name of what its compiled step computes (inference/compiler.py)
    scores = True               # hypotheses get their scores (Greedy(scores=False): ids only)

    def rank(self, logits: Tensor, scores: Tensor, pad: int) -> tuple[Tensor, Tensor, Tensor]:
        """logits (sent*K, vocab), scores (sent, K) -> candidates' scores, tokens, parents, each (sent, C)."""
        raise NotImplementedError

    def advance(self, logits: Tensor, slots: tuple, length: Tensor, alpha: Tensor, pad: int, eos: int) -> tuple:
        """Next-token logits (slots*K, vocab) of the step that makes `length` (0-dim) tokens, and the `Slots`
        (or a plain tuple of its fields) -> the fields of an `Advance`, in its order (a flat tuple of tensors:
        a compiled graph returns it as it is). No host sync."""
        _, scores, limits, live, worst, history = slots
        best, tokens, parents = self.rank(logits, scores, pad)               # (slots, C) ranked, best first
        n, C = best.shape
        K = scores.size(1)
        valid = best > -math.inf
        at_limit = length >= limits                                         # (slots,)
        ends = (tokens == eos) | at_limit[:, None]                          # (slots, C)
        stays = ~ends & valid
        if C == 1:                                                          # greedy: one candidate; it stays or ends
            ended = ends & valid & live[:, None]                            # the sentence (it has no other beam)
            new_scores = torch.where(stays, best, -math.inf)                # (slots, 1)
            new, rows = torch.where(live, tokens[:, 0], pad), torch.arange(n, device=best.device)   # PAD once ended
            history = history.index_copy(1, (length - 1).view(1), new[:, None])
            bound = new_scores[:, 0]                                        # while live, nothing finished to beat
            done = live & ~stays[:, 0]
        else:
            rank = torch.arange(C, device=best.device)                      # (C,)
            ended = ends & valid & (rank < K) & live[:, None]               # only the top K may finish
            order = torch.where(stays, rank, rank + C).topk(K, dim=1, largest=False).indices   # (slots, K) stay
            kept = stays.gather(1, order)
            new_scores = torch.where(kept, best.gather(1, order), -math.inf)    # (slots, K)
            new = tokens.gather(1, order).reshape(-1)                       # (slots*K,)
            rows = (torch.arange(n, device=best.device)[:, None] * K + parents.gather(1, order)).reshape(-1)
            history = history.index_select(0, rows).index_copy(1, (length - 1).view(1), new[:, None])
            bound = best_possible(new_scores, length, limits[:, None], alpha).amax(dim=1)   # (slots,)
            done = live & (at_limit | ~kept.any(dim=1) | (bound <= worst))
        return new, rows, new_scores, history, best, tokens, parents, ended, bound, done, ended.any() | done.any()


class Greedy(Search):
    """The most probable next token of each sentence: one beam, one candidate. scores=False: the tokens only, for
    a caller that keeps nothing else (the Translator): no log-normaliser over the vocabulary at each step (which
    chooses nothing in greedy search), and hypotheses with a NaN score."""

    def __init__(self, scores: bool = True) -> None:
        self.scores, self.kind = scores, "beam1" if scores else "greedy"

    def rank(self, logits: Tensor, scores: Tensor, pad: int) -> tuple[Tensor, Tensor, Tensor]:
        """logits (sent, vocab), scores (sent, 1) -> each row's best: score, token, parent (0), each (sent, 1)
        (scores=False: the scores as they were, 0 while live)."""
        log_probs, tokens = most_probable(logits, pad, self.scores)         # (sent, 1) float64 or None, ids
        return scores if log_probs is None else scores + log_probs, tokens, torch.zeros_like(tokens)


class BeamSearch(Search):
    """K beams per sentence: the 2K best continuations of all K beams, so that K of them can stay live
    even when up to K others end with EOS."""

    def __init__(self, beam: int) -> None:
        if beam < 1:
            raise ValueError(f"beam must be >= 1, got {beam}")
        self.beam, self.kind = beam, f"beam{beam}"

    def rank(self, logits: Tensor, scores: Tensor, pad: int) -> tuple[Tensor, Tensor, Tensor]:
        """logits (sent*K, vocab), scores (sent, K) -> the 2K best continuations of all K beams: scores, tokens,
        parents (beam index in [0, K)), each (sent, 2K), best first."""
        return best_continuations(logits, scores, pad, 2 * self.beam)


def strategy(beam: int, scores: bool = True) -> Greedy | BeamSearch:
    """Greedy for beam 1 (scores=False: without hypothesis scores), beam search otherwise."""
    return Greedy(scores) if beam == 1 else BeamSearch(beam)


# ---- the loop -----------------------------------------------------------------------------
def step(model, search: Search, cache, memory: Tensor | None, src_pad: Tensor, slots: tuple, length: Tensor,
         alpha: Tensor) -> tuple:
    """One step for every row: the model's own `decode_step` through its KV cache, the search's `advance`
    (the step that makes `length` tokens, a 0-dim tensor), and with beams the cache's rows then follow
    their parents. The fields of an `Advance`. A compiled step (inference/compiler.py) is this function."""
    logits = model.decode_step(slots[0][:, None], memory, src_pad, cache)[:, -1]   # (rows, vocab)
    out = search.advance(logits, slots, length, alpha, model.cfg.pad_id, model.cfg.eos_id)
    if search.beam > 1:
        cache.reorder(out[1], same_source=True)                             # beams follow their parents' rows
    return out


def steps(model, search: Search, cache, memory, src_pad: Tensor, slots: tuple, length: Tensor, alpha: Tensor, k: int):
    """Greedy's `step` k times in one graph, the first making `length` tokens: tokens fed back, an ended sentence not
    live (its row writes PAD), the position held at the last once none is; tokens, scores, live, history, live count."""
    limits, worst, first = slots[2], slots[4], cache.position
    for i in range(k):
        cache.position = torch.clamp(first + i, max=model.cfg.max_len - 1)
        tokens, _, scores, history, *_, done, _ = step(model, search, cache, memory, src_pad, slots, length + i, alpha)
        slots = (tokens, scores, limits, slots[3] & ~done, worst, history)   # an ended sentence is no longer live
    tokens, scores, _, live, _, history = slots
    return tokens, scores, live, history, live.sum()


class _Run:
    """One batch: K beams per sentence, the live sentences padded up to a bucket (a finished sentence's rows
    stay, dead, until the live ones fit a smaller bucket), the source encoded once, then `step` after
    `step`: as it is, or as `compiled` runs it (inference.compiler.CompiledDecoder: the same function)."""

    def __init__(self, model, src: Tensor, src_pad: Tensor, search: Search, compiled=None) -> None:
        self.model, self.search, self.compiled, self.slots = model, search, compiled, bucket(src.size(0))
        index = torch.arange(src.size(0), device=src.device).repeat_interleave(search.beam)
        extra = self.capacity(src.size(0)) * search.beam - index.numel()     # padding rows: the first sentence
        if extra:
            index = torch.cat([index, index[:1].expand(extra)])             # (rows,) the sentence of each row
        same = extra == 0 and search.beam == 1                              # a row a sentence
        self.src_pad, self.cache, self.memory = src_pad if same else src_pad[index], model.new_cache(), None
        if compiled is None:
            self.memory = model.encode(src, src_pad)[index]                 # (rows, src, d)
        else:
            compiled.source(self.cache, src, src_pad, index)                # cross-attention's K/V in the cache
            self.cache.joined = torch.zeros(index.numel(), dtype=torch.long, device=src.device)   # each row: at 0

    def capacity(self, sentences: int) -> int:
        """Slots for `sentences` live sentences: the smallest bucket that holds them (compiled: not below `fewest`)."""
        least = 1 if self.compiled is None else min(self.slots, self.compiled.fewest.get(self.search.kind, 1))
        return max(bucket(sentences), least)

    def step(self, slots: Slots, length: int, alpha: Tensor) -> tuple:
        """The step that makes `length` tokens: the fields of an `Advance`."""
        if self.compiled is not None:
            return self.compiled.step(self.cache, self.search, slots, length, alpha, self.src_pad)
        at = torch.tensor(length, device=slots.tokens.device)
        return step(self.model, self.search, self.cache, self.memory, self.src_pad, slots, at, alpha)

    def keep(self, rows: Tensor) -> None:
        """Keep rows `rows` (finished sentences left): the cache, the encoder output and its padding."""
        self.cache.reorder(rows)
        self.src_pad = self.src_pad[rows]
        self.memory = None if self.memory is None else self.memory[rows]


def _initial(sentences: int, n_slots: int, K: int, limits: Tensor, bos: int, device, ahead: int = 0) -> Slots:
    """Slots for `sentences` sentences (their `limits`) padded to `n_slots`, a live beam each; `ahead` columns more."""
    live = torch.arange(n_slots, device=device) < sentences
    scores = torch.full((n_slots, K), -math.inf, dtype=torch.float64, device=device)
    scores[:sentences, 0] = 0.0
    padded = limits if sentences == n_slots else torch.cat([limits, limits.new_ones(n_slots - sentences)])
    return Slots(tokens=torch.full((n_slots * K,), bos, dtype=torch.long, device=device), scores=scores,
                 limits=padded.to(device), live=live,
                 worst=torch.full((n_slots,), -math.inf, dtype=torch.float64, device=device),
                 history=torch.zeros(n_slots * K, int(limits.max()) + ahead, dtype=torch.long, device=device))


def _harvest(ended: Tensor, history: Tensor, limits: Tensor, sentence: list[int], finished: list, eos: int) -> None:
    """After a block, greedy hypotheses of the slots `ended` (bool) from history: ids before EOS, or to the limit."""
    slots = ended.nonzero()[:, 0].tolist()
    for slot, ids, limit in zip(slots, history[slots].tolist(), limits[slots].tolist(), strict=True):
        end = ids.index(eos) if eos in ids[:limit] else limit
        finished[sentence[slot]].add(Hypothesis(ids[:end], math.nan, math.nan, finished=end < limit))


def _finish(advance: Advance, slots: Slots, length: int, sentence: list[int], finished: list[Finished],
            eos: int, alpha: float, stop: str, scored: bool, starts: list[int]) -> tuple[Tensor, Tensor]:
    """Record the hypotheses this step finished (host work, only on a step with events); the slots' new `worst`
    and the sentences now done (one candidate, greedy: `advance.done`, the ended ones; no `worst` to keep)."""
    worst, K, single = slots.worst, slots.scores.size(1), advance.ranked.size(1) == 1
    ended = advance.ended.nonzero().tolist()                                 # [(slot, rank)], best first per slot
    if ended:                                                                # host lists: one copy each, not a
        worsts, scores = worst.tolist(), advance.ranked.tolist() if scored else None   # tensor op per hypothesis
        tokens, parents = advance.ranked_tokens.tolist(), advance.ranked_parents.tolist()
        rows = [slot * K + parents[slot][c] for slot, c in ended]           # the rows they continue
        history = slots.history[rows, : length - 1].tolist()                 # (ended, length - 1)
        for (slot, c), ids in zip(ended, history, strict=True):
            score, token = scores[slot][c] if scored else math.nan, tokens[slot][c]
            start = starts[slot]                                             # the column its sentence began at
            hyp = Hypothesis(ids[start:] + ([] if token == eos else [token]), score,
                             length_normalized(score, length - start, alpha), finished=token == eos)
            worsts[slot] = finished[sentence[slot]].add(hyp)
            finished[sentence[slot]].top |= c == 0                           # the step's best candidate ended
        worst = worst if single else torch.tensor(worsts, dtype=worst.dtype, device=worst.device)
    if single:
        return worst, advance.done
    done = advance.done | (slots.live & (advance.bound <= worst))
    if stop == "top":                                                        # and n hypotheses are in
        top = torch.tensor([s >= 0 and finished[s].top for s in sentence], device=worst.device)
        done = done | (slots.live & top & (worst > -math.inf))
    elif stop == "full":                                                     # K hypotheses finished
        full = torch.tensor([s >= 0 and finished[s].count >= K for s in sentence], device=worst.device)
        done = done | (slots.live & full)
    return worst, done


def _kept(slots: Slots, keep: Tensor, alive: int, K: int) -> tuple[Slots, Tensor]:
    """The slots `keep` (the `alive` live ones first, then copies of the first as padding, `live` False): the new
    slots and their rows."""
    rows = keep if K == 1 else (keep[:, None] * K + torch.arange(K, device=keep.device)).reshape(-1)   # (slots*K,)
    live = torch.arange(keep.numel(), device=keep.device) < alive
    scores = torch.where(live[:, None], slots.scores[keep], -math.inf)
    return Slots(slots.tokens[rows], scores, slots.limits[keep], live, slots.worst[keep], slots.history[rows]), rows


@torch.no_grad()
def generate(model, src: Tensor, search: Search, src_pad: Tensor | None = None,
             alpha: float = DEFAULT_ALPHA, max_len: int | Tensor | None = None,
             n_best: int = 1, stop: str = DEFAULT_STOP, compiled=None,
             more: Iterator[Tensor] | None = None) -> list[list[Hypothesis]]:
    """The n_best hypotheses of each sentence of a batch, best first (n_best <= the beam); `stop` one of
    STOP_RULES.

    `model` is anything with the decoding API: cfg, encode, new_cache and decode_step (the model, its
    prepared copy, a bf16 / int8 copy); `compiled` (inference.compiler.CompiledDecoder of the same model)
    runs its steps as compiled packages. The rows are slots of K beams; a slot whose sentence is done
    stays (dead) until the live sentences fit a smaller bucket, then the live slots move to the front.
    `more` (where `joins`): the padded sources of later batches, whose sentences join this one's rows as its
    sentences end (decoding/joining.py); their hypotheses follow, batch after batch.
    """
    K = search.beam
    if not 1 <= n_best <= K:
        raise ValueError(f"n_best must be in [1, beam={K}], got {n_best}")
    if stop not in STOP_RULES:
        raise ValueError(f"stop must be one of {', '.join(STOP_RULES)}, got {stop!r}")
    cfg = model.cfg
    src_pad = src == cfg.pad_id if src_pad is None else src_pad
    n = src.size(0)
    limits = sentence_limits(src_pad, cfg.max_len, max_len)                  # (batch,)
    if n == 0:
        return []
    run = _Run(model, src, src_pad, search, compiled)
    n_slots = run.capacity(n)
    ahead = 0 if compiled is None else max(compiled.per_call.values()) - 1   # a block's steps past the longest limit
    slots = _initial(n, n_slots, K, limits, cfg.bos_id, src.device, ahead)
    sentence = list(range(n)) + [-1] * (n_slots - n)                         # slot -> sentence (-1: padding)
    starts = [0] * n_slots                                                   # slot -> the column it began at
    finished = [Finished(n_best) for _ in range(n)]
    alpha_t = torch.tensor(alpha, dtype=torch.float64, device=src.device)
    waiting = None if more is None else Waiting(run, more, max_len, n_best)
    length, alive = 0, n
    while True:
        k = 1 if compiled is None else compiled.steps_per_call(search, len(sentence))   # > 1: a compiled block
        block = None if k == 1 else compiled.step(run.cache, search, slots, length + 1, alpha_t, run.src_pad, k)
        if block is not None:                                                # k steps, one look (None: not built)
            length, (tokens, scores, live, history, count) = length + k, block
            if int(count) == alive:                                          # no sentence ended in the block
                slots = Slots(tokens, scores, slots.limits, live, slots.worst, history)
                continue
            _harvest(slots.live & ~live, history, slots.limits, sentence, finished, cfg.eos_id)   # (no joins)
            slots, alive = Slots(tokens, scores, slots.limits, live, slots.worst, history), int(count)
        else:
            length += 1                                                      # tokens generated after this step
            advance = Advance(*run.step(slots, length, alpha_t))
            if not advance.events.item():                                    # nothing ended: the beams go on
                slots = Slots(advance.tokens, advance.scores, *slots[2:5], advance.history)
                if waiting is None or not waiting.at_last_column(length):    # (else its first columns dropped)
                    continue
            else:
                worst, done = _finish(advance, slots, length, sentence, finished, cfg.eos_id, alpha, stop,
                                      search.scores, starts)
                live = slots.live & ~done
                slots = Slots(advance.tokens, advance.scores, slots.limits, live, worst, advance.history)
                alive = int(live.sum())
        if waiting is not None:                                              # sentences join in free slots
            slots, length, alive = waiting.after(slots, sentence, starts, finished, length, alive)
        if alive == 0:
            break
        capacity = run.capacity(alive)
        if capacity < len(sentence) and (waiting is None or waiting.done):   # the live slots move to the front
            keep = slots.live.nonzero()[:, 0]
            keep = torch.cat([keep, keep[:1].expand(capacity - alive)])
            slots, rows = _kept(slots, keep, alive, K)
            run.keep(rows)
            sentence = [sentence[s] for s in keep.tolist()[:alive]] + [-1] * (capacity - alive)
            starts = [starts[s] for s in keep.tolist()[:alive]] + [0] * (capacity - alive)
    return [f.result() for f in finished]


# ---- the common calls ---------------------------------------------------------------------
def greedy(model, src: Tensor, src_pad: Tensor | None = None, max_len: int | Tensor | None = None
           ) -> list[list[int]]:
    """Most probable next token at every step, for a batch of sentences; ids without BOS/EOS."""
    return [hyps[0].tokens for hyps in generate(model, src, Greedy(scores=False), src_pad, max_len=max_len)]


def beam_search(model, src: Tensor, src_pad: Tensor | None = None, beam: int = 4,
                alpha: float = DEFAULT_ALPHA, max_len: int | Tensor | None = None) -> list[list[int]]:
    """The best hypothesis of K beams per sentence; ids without BOS/EOS. With alpha = 0 and K = 1 this is
    greedy."""
    return [hyps[0].tokens for hyps in generate(model, src, BeamSearch(beam), src_pad, alpha, max_len)]
