"""Which tokens a search continues with (decoding/search.py ranks them): greedy, each row's most probable next
token and its log-probability; beams, each sentence's n best continuations of all its beams together, without
sorting a table of scores over the vocabulary for every beam. One algorithm eagerly and in a compiled step, but
for the greedy choice, where a measurement keeps torch's own ops eagerly (`most_probable`).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor


def most_probable(logits: Tensor, pad_id: int, normalise: bool = True) -> tuple[Tensor | None, Tensor]:
    """Each row's most probable next token (never PAD) and its float64 log-probability logit - logsumexp(logits).
    logits (rows, vocab) -> (rows, 1) float64, (rows, 1) ids. normalise=False: the ids only (None for the
    log-probabilities), no pass of exponentials over the table (CTranslate2's greedy search without scores).

    Traced for a compiled step: the vocabulary read around PAD in slices, the best by plain reductions (its value,
    then its first id) and the exponentials in the logits' precision summed in float64, loops of the step's own
    kernel, which vectorise where a max with indices does not; (a) the ids a table of data in the graph, which the
    loop reads (made by `arange` in the graph, a vector of ids was built at every iteration: a 32 x 4,000 float32
    choice 85 against 39 us of the step's kernel, 1 thread, Xeon, AVX-512). Eagerly those are ~13 ops of their own
    over the (rows, vocab) table, so torch's max with indices and float64 logsumexp instead (5 ops): a greedy decode
    of the d128 2+2 model took 0.81x the time at batch 1 and 0.83x at batch 32 (1 thread). The two agree to float
    rounding (tests/test_compiled.py)."""
    x = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    if not torch.compiler.is_compiling():
        allowed = x.clone()
        allowed[:, pad_id] = -math.inf                                     # the others keep their values
        best, tokens = allowed.max(dim=-1, keepdim=True)                   # (rows, 1): one kernel
        return (best.double() - torch.logsumexp(x.double(), dim=-1, keepdim=True) if normalise else None), tokens
    vocab, pad = x.size(-1), x[:, pad_id: pad_id + 1]                       # (rows, 1) PAD's logit
    ids = torch.tensor(range(vocab), dtype=x.dtype, device=x.device)       # (vocab,) data: a constant table (a)
    parts = [(x[:, a:b], a) for a, b in ((0, pad_id), (pad_id + 1, vocab)) if b > a]   # the ids but PAD: slices,
    best = functools.reduce(torch.maximum, [p.amax(dim=-1, keepdim=True) for p, _ in parts])   # not a mask (rows, 1)
    tokens = functools.reduce(torch.minimum, [torch.where(p == best, ids[a: a + p.size(-1)], vocab)
                                              .amin(dim=-1, keepdim=True) for p, a in parts]).long()
    if not normalise:
        return None, tokens
    top = torch.maximum(best, pad)                                         # the row's largest logit
    total = functools.reduce(torch.add, [torch.exp(p - top).double().sum(dim=-1, keepdim=True) for p, _ in parts],
                             torch.exp(pad - top).double())               # (rows, 1) float64
    return best.double() - (top.double() + total.log()), tokens


def _without_pad(x: Tensor, pad_id: int) -> Tensor:
    """x (rows, vocab) with PAD's column at -inf."""
    index = torch.arange(x.size(-1), device=x.device, dtype=x.dtype)       # (vocab,)
    return torch.where(index == pad_id, -math.inf, x)


def _log_normalizer(x: Tensor, top: Tensor) -> Tensor:
    """logsumexp of each row (rows, 1) float64: the exponentials of x - top in x's precision (top: the row's
    largest logit, (rows, 1)), summed in float64."""
    return top.double() + torch.exp(x - top).double().sum(dim=-1, keepdim=True).log()


TOP_BLOCK = 32                    # the vocabulary read in blocks of this many ids


def best_continuations(logits: Tensor, scores: Tensor, pad_id: int, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """The n best continuations of each sentence's K beams: score + log p(token), over every beam and token
    (PAD never), best first. logits (sent*K, vocab), scores (sent, K) float64 -> scores (sent, n) float64,
    tokens (sent, n), parents (sent, n): the beam in [0, K) each continues.

    Without a table of scores over the vocabulary: a row's log-normaliser (its exponentials summed in
    float64), its maxima over blocks of TOP_BLOCK ids raised by score - normaliser (a row's own order is its
    logits'), the n best blocks of the sentence, then the n best of their values. The n best lie in the n
    blocks whose maxima are largest (any other block's best is beaten by n blocks, so by n values). On the
    CPU `topk` costs about 2 us a row whatever its length: two calls over a sentence's rows together, not
    two per beam row (docs/performance.md)."""
    sent, K = scores.shape
    x = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    rows, vocab = x.shape
    n = min(n, K * vocab)
    allowed = _without_pad(x, pad_id)                                      # (rows, vocab)
    if vocab < 4 * n * TOP_BLOCK:
        base = scores.reshape(rows, 1) - _log_normalizer(x, x.amax(dim=-1, keepdim=True))   # (rows, 1)
        best, at = (base + allowed.double()).view(sent, K * vocab).topk(n)  # (sent, n)
        return best, at % vocab, at // vocab
    blocks = -(-vocab // TOP_BLOCK)
    tiled = F.pad(allowed, (0, blocks * TOP_BLOCK - vocab), value=-math.inf).view(rows, blocks, TOP_BLOCK)
    maxima = tiled.amax(dim=-1)                                            # (rows, blocks)
    top = torch.maximum(maxima.amax(dim=-1, keepdim=True), x[:, pad_id: pad_id + 1])   # (rows, 1) = x's max, exactly
    base = scores.reshape(rows, 1) - _log_normalizer(x, top)               # (rows, 1): a row's value = base + logit
    chosen = (base + maxima.double()).view(sent, K * blocks).topk(n).indices   # (sent, n) best blocks
    row = torch.arange(sent, device=x.device)[:, None] * K + chosen // blocks               # (sent, n) their rows
    picked = tiled.reshape(rows * blocks, TOP_BLOCK).index_select(0, (row * blocks + chosen % blocks).view(-1))
    values = base.view(rows)[row][:, :, None] + picked.view(sent, n, TOP_BLOCK).double()     # (sent, n, TOP_BLOCK)
    best, at = values.view(sent, n * TOP_BLOCK).topk(n)                    # (sent, n)
    block = chosen.gather(1, at // TOP_BLOCK)                              # (sent, n) in [0, K * blocks)
    return best, (block % blocks) * TOP_BLOCK + at % TOP_BLOCK, block // blocks
