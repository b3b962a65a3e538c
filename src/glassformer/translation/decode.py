"""Decoding: greedy and beam search over the KV cache, batched over sentences, and the text-to-text
Translator that the CLI, the evaluation and the training loop share.

Output length limit per sentence: a * source_len + b generated tokens (EOS included), capped by the
model's max_len. Beam search ranks finished hypotheses by score / len^alpha, where the score is the
sum of token log-probabilities and len counts generated tokens including EOS. A sentence is done
only when no live beam can still beat its best finished hypothesis: since log-probs are <= 0, a live
beam with score s at length L can at best reach max(s / (L+1)^alpha, s / limit^alpha).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import UsageError
from ..inference import decoding_threads, prepare, use_threads
from ..model import Transformer
from .tokenize import BOS, EOS, PAD, SourceEncoding, SourceTokenizer, TargetTokenizer

LENGTH_A, LENGTH_B = 2.0, 10      # output limit: a * source_len + b tokens
DEFAULT_ALPHA = 1.0               # length penalty exponent (chosen on dev, docs/translator.md)


def output_limits(src_pad: Tensor, model_max_len: int, a: float = LENGTH_A, b: int = LENGTH_B) -> Tensor:
    """Most tokens each sentence may generate (EOS included): a * source_len + b, at most max_len."""
    src_len = (~src_pad).sum(dim=1)                                          # (batch,)
    return torch.clamp((src_len.double() * a).long() + b, max=model_max_len)


def _limits(model, src: Tensor, src_pad: Tensor, max_len: int | Tensor | None) -> Tensor:
    cap = model.cfg.max_len
    if max_len is None:
        return output_limits(src_pad, cap)
    if isinstance(max_len, int):
        return torch.full((src.size(0),), min(max_len, cap), dtype=torch.long)
    return torch.clamp(max_len.long().cpu(), max=cap)


@torch.no_grad()
def greedy(model, src: Tensor, src_pad: Tensor | None = None, max_len: int | Tensor | None = None
           ) -> list[list[int]]:
    """Most probable next token at every step, for a batch of sentences; ids without BOS/EOS.

    Finished sentences leave the batch (their cache rows are dropped with `cache.reorder`).
    """
    src_pad = src == model.cfg.pad_id if src_pad is None else src_pad
    limits = _limits(model, src, src_pad, max_len)                           # (batch,)
    memory = model.encode(src, src_pad)                                      # (batch, src, d)
    cache = model.new_cache()
    out: list[list[int]] = [[] for _ in range(src.size(0))]
    alive = list(range(src.size(0)))                                         # sentences still decoding
    tokens = torch.full((src.size(0), 1), BOS, dtype=torch.long, device=src.device)
    for step in range(int(limits.max()) if len(alive) else 0):
        logits = model.decode_step(tokens, memory, src_pad, cache)[:, -1]   # (alive, vocab)
        nxt = logits.argmax(dim=-1)                                          # (alive,)
        keep = []
        for row, (b, token) in enumerate(zip(alive, nxt.tolist(), strict=True)):
            if token != EOS:
                out[b].append(token)
            if token != EOS and step + 1 < int(limits[b]):
                keep.append(row)
        if not keep:
            break
        if len(keep) < len(alive):
            index = torch.tensor(keep, device=src.device)
            cache.reorder(index)
            memory, src_pad, nxt = memory[index], src_pad[index], nxt[index]
            alive = [alive[r] for r in keep]
        tokens = nxt[:, None]
    return out


@dataclass
class Hypothesis:
    """A finished beam: generated ids (EOS excluded), summed log-prob, and its length-penalised score."""

    tokens: list[int]
    score: float
    normalized: float


def length_normalized(score: float, length: int, alpha: float) -> float:
    """score / length^alpha; length counts generated tokens including EOS."""
    return score / (length ** alpha)


def _best_possible(score: float, length: int, limit: int, alpha: float) -> float:
    """Upper bound of the normalised score a live beam (score, length so far) can still reach."""
    if score == -math.inf:
        return -math.inf
    nearest = min(length + 1, limit)
    return max(length_normalized(score, nearest, alpha), length_normalized(score, limit, alpha))


@torch.no_grad()
def beam_search(model, src: Tensor, src_pad: Tensor | None = None, beam: int = 4,
                alpha: float = DEFAULT_ALPHA, max_len: int | Tensor | None = None,
                n_best: bool = False) -> list[list[int]] | list[Hypothesis]:
    """K beams per sentence, batched; returns the best hypothesis' ids (or Hypothesis if n_best).

    Each step ranks the K x V continuations: EOS among the top K become finished hypotheses, the
    best K non-EOS ones (taken from the top 2K) stay live. The cache follows the beams via
    `cache.reorder`. With alpha = 0 and K = 1 this is exactly greedy; with alpha > 0 a live beam
    whose best reachable normalised score still beats the finished one keeps going.
    """
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    src_pad = src == model.cfg.pad_id if src_pad is None else src_pad
    n_sent, K = src.size(0), beam
    limits = _limits(model, src, src_pad, max_len).tolist()                 # per sentence
    memory = model.encode(src, src_pad)                                      # (batch, src, d)
    rows = torch.arange(n_sent, device=src.device).repeat_interleave(K)      # (batch*K,)
    memory, src_pad = memory[rows], src_pad[rows]                            # (batch*K, src, d)
    cache = model.new_cache()
    alive = list(range(n_sent))
    seqs: list[list[int]] = [[] for _ in range(n_sent * K)]
    scores = torch.full((n_sent, K), -math.inf, dtype=torch.float64)
    scores[:, 0] = 0.0                                                       # one live beam at the start
    scores = scores.view(-1)
    tokens = torch.full((n_sent * K, 1), BOS, dtype=torch.long, device=src.device)
    best: list[Hypothesis | None] = [None] * n_sent
    step = 0
    while alive:
        logits = model.decode_step(tokens, memory, src_pad, cache)[:, -1]   # (alive*K, vocab)
        logp = F.log_softmax(logits.double(), dim=-1).cpu()
        V = logp.size(-1)
        cand = (scores[:, None] + logp).view(len(alive), K * V)             # (alive, K*V)
        top_s, top_i = cand.topk(min(2 * K, K * V), dim=-1)                  # (alive, 2K)
        top_s, top_i = top_s.tolist(), top_i.tolist()
        length = step + 1                                                    # tokens generated so far
        index: list[int] = []
        new_scores: list[float] = []
        new_tokens: list[int] = []
        new_seqs: list[list[int]] = []
        still: list[int] = []
        for j, b in enumerate(alive):
            limit = limits[b]
            live: list[tuple[float, int, int]] = []
            for rank, (s, flat) in enumerate(zip(top_s[j], top_i[j], strict=True)):
                if s == -math.inf:
                    break
                parent, token = j * K + flat // V, flat % V
                if token == EOS or length >= limit:
                    if rank >= K:                                            # only the top K may finish
                        continue
                    ids = seqs[parent] + ([] if token == EOS else [token])
                    norm = length_normalized(s, length, alpha)
                    if best[b] is None or norm > best[b].normalized:
                        best[b] = Hypothesis(ids, s, norm)
                elif len(live) < K:
                    live.append((s, parent, token))
            bound = max((_best_possible(s, length, limit, alpha) for s, _, _ in live), default=-math.inf)
            if length >= limit or not live or (best[b] is not None and bound <= best[b].normalized):
                continue                                                     # sentence done
            still.append(b)
            while len(live) < K:                                             # dead placeholder rows
                live.append((-math.inf, live[0][1], PAD))
            for s, parent, token in live:
                index.append(parent)
                new_scores.append(s)
                new_tokens.append(token)
                new_seqs.append(seqs[parent] + [token])
        if not still:
            break
        idx = torch.tensor(index, device=src.device)
        cache.reorder(idx)
        memory, src_pad = memory[idx], src_pad[idx]
        scores = torch.tensor(new_scores, dtype=torch.float64)
        tokens = torch.tensor(new_tokens, dtype=torch.long, device=src.device)[:, None]
        seqs, alive = new_seqs, still
        step += 1
    final = [h if h is not None else Hypothesis([], -math.inf, -math.inf) for h in best]
    return final if n_best else [h.tokens for h in final]


def decode_batch(model, src: Tensor, src_pad: Tensor | None = None, beam: int = 1,
                 alpha: float = DEFAULT_ALPHA, max_len: int | Tensor | None = None) -> list[list[int]]:
    """Greedy for beam 1, beam search otherwise."""
    if beam <= 1:
        return greedy(model, src, src_pad, max_len)
    return beam_search(model, src, src_pad, beam=beam, alpha=alpha, max_len=max_len)


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int = PAD) -> Tensor:
    """Right-pad id lists into (batch, longest)."""
    width = max((len(s) for s in sequences), default=0) or 1
    out = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    for r, s in enumerate(sequences):
        out[r, : len(s)] = torch.tensor(list(s), dtype=torch.long)
    return out


class Translator:
    """Chinese text in, English text out: segmentation, length checks, batched decoding, detokenization."""

    def __init__(self, model, source: SourceTokenizer, target: TargetTokenizer,
                 device: str | torch.device = "cpu", batch_size: int = 64) -> None:
        self.model, self.source, self.target = model, source, target
        self.device = torch.device(device)
        self.batch_size = batch_size

    @classmethod
    def load(cls, folder, device: str | torch.device = "cpu") -> Translator:
        from .checkpoint import load_translator_parts

        model, source, target, _ = load_translator_parts(folder, device)
        return cls(model, source, target, device)

    @property
    def max_source_len(self) -> int:
        """Longest source (in units) the model's positions accept."""
        return self.model.cfg.max_len

    def analyse(self, texts: Sequence[str]) -> list[SourceEncoding]:
        """Segment and encode each text (units, ids, unknown units)."""
        return [self.source.analyse(t) for t in texts]

    def check_lengths(self, encodings: Sequence[SourceEncoding], truncate: bool = False,
                      first_line: int = 1) -> list[list[int]]:
        """Source ids per text; over-long input is a UsageError naming the limit, or cut with truncate."""
        limit = self.max_source_len
        ids = []
        for n, enc in enumerate(encodings, start=first_line):
            if len(enc.ids) > limit and not truncate:
                raise UsageError(f"input line {n}: {len(enc.ids)} units, over the model's limit of {limit} "
                                 "source units (shorten it or pass --truncate)")
            ids.append(enc.ids[:limit])
        return ids

    def translate_ids(self, sources: Sequence[Sequence[int]], beam: int = 1,
                      alpha: float = DEFAULT_ALPHA) -> list[list[int]]:
        """Target ids for source id lists; sorted by length into batches, returned in input order.

        Decoding runs on glassformer.inference (prepared from the model's weights now, so a model that is
        still training is read afresh at each call), with the thread policy for this batch size."""
        out: list[list[int]] = [[] for _ in sources]
        order = sorted((i for i, s in enumerate(sources) if len(s)), key=lambda i: len(sources[i]))
        if not order:
            return out
        decoder = prepare(self.model) if isinstance(self.model, Transformer) else self.model
        with use_threads(decoding_threads(min(len(order), self.batch_size) * beam)):
            for start in range(0, len(order), self.batch_size):
                chunk = order[start: start + self.batch_size]
                src = pad_batch([sources[i] for i in chunk]).to(self.device)
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
                    hyps = decode_batch(decoder, src, beam=beam, alpha=alpha)
                for i, h in zip(chunk, hyps, strict=True):
                    out[i] = h
        return out

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.target.decode(ids)

    def translate(self, texts: Sequence[str], beam: int = 1, alpha: float = DEFAULT_ALPHA,
                  truncate: bool = False) -> list[str]:
        """One English line per input text (an empty or blank text gives an empty line)."""
        ids = self.check_lengths(self.analyse(texts), truncate)
        hyps = self.translate_ids(ids, beam, alpha)
        return [self.detokenize(h) if src else "" for h, src in zip(hyps, ids, strict=True)]

    def translate_units(self, unit_lists: Sequence[Sequence[str]], beam: int = 1,
                        alpha: float = DEFAULT_ALPHA) -> list[str]:
        """Translate already segmented sources (e.g. the corpus's gold units)."""
        limit = self.max_source_len
        ids = [self.source.vocab.encode(list(units))[:limit] for units in unit_lists]
        return [self.detokenize(h) if src else "" for h, src in
                zip(self.translate_ids(ids, beam, alpha), ids, strict=True)]
