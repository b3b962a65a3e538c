"""Which tokens a search continues with (decoding/search.py ranks them): greedy, each row's most probable next
token and its log-probability; beams, each sentence's n best continuations of all its beams together, without
sorting a table of scores over the vocabulary for every beam.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def most_probable(logits: Tensor, pad_id: int) -> tuple[Tensor, Tensor]:
    """Each row's most probable next token (never PAD) and its float64 log-probability logit - logsumexp(logits).
    logits (rows, vocab) -> (rows, 1) float64, (rows, 1) ids.

    Eagerly: torch's float64 log-softmax, then its max (one kernel each). Traced for a compiled step, where a
    kernel of its own is generated for what follows the products: the exponentials in the logits' precision
    summed in float64 (`_log_normalizer`), and the best by plain reductions (its value, then its first id),
    which vectorise where a max with indices does not. The two agree to float rounding (tests/test_compiled.py)."""
    x = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    if not torch.compiler.is_compiling():
        log_probs = F.log_softmax(x.double(), dim=-1)
        log_probs[:, pad_id] = -math.inf                                   # the others keep their values
        return log_probs.max(dim=-1, keepdim=True)
    lse, index, allowed = _log_normalizer(x, pad_id)
    best = allowed.amax(dim=-1, keepdim=True)                              # (rows, 1)
    tokens = torch.where(allowed == best, index, x.size(-1)).amin(dim=-1, keepdim=True).long()
    return best.double() - lse, tokens


def _log_normalizer(x: Tensor, pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """Traced forms' shared start: logsumexp of each row (rows, 1) float64 (the exponentials in x's precision,
    summed in float64), the token ids as numbers of x's dtype (vocab,), and x with PAD at -inf (rows, vocab)."""
    top = x.max(dim=-1, keepdim=True).values                               # (rows, 1)
    lse = top.double() + torch.exp(x - top).double().sum(dim=-1, keepdim=True).log()   # (rows, 1) float64
    index = torch.arange(x.size(-1), device=x.device, dtype=x.dtype)       # (vocab,)
    return lse, index, torch.where(index == pad_id, -math.inf, x)


TOP_BLOCK = 32                    # top_n: the vocabulary read in blocks of this many ids


def best_continuations(logits: Tensor, scores: Tensor, pad_id: int, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """The n best continuations of each sentence's K beams: score + log p(token), over every beam and token
    (PAD never), best first. logits (sent*K, vocab), scores (sent, K) float64 -> scores (sent, n) float64,
    tokens (sent, n), parents (sent, n): the beam in [0, K) each continues.

    Eagerly: torch's float64 log-softmax, the scores added, then `top_n` over each sentence's K x vocab.
    Traced for a compiled step, the same blocks without the table: a row's log-normaliser (its exponentials
    summed in float64), its block maxima raised by score - normaliser (a row's own order is its logits'), the
    n best blocks of the sentence, the n best of their values. The two agree to float rounding
    (tests/test_compiled.py)."""
    sent, K = scores.shape
    x = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    rows, vocab = x.shape
    n = min(n, K * vocab)
    if not torch.compiler.is_compiling():
        log_probs = F.log_softmax(x.double(), dim=-1)
        log_probs[:, pad_id] = -math.inf                                   # the others keep their values
        best, at = top_n((scores.reshape(rows, 1) + log_probs).view(sent, K * vocab), n)   # (sent, n)
        return best, at % vocab, at // vocab
    lse, _, allowed = _log_normalizer(x, pad_id)                           # (rows, 1), _, (rows, vocab)
    base = scores.reshape(rows, 1) - lse                                   # (rows, 1): a row's value = base + logit
    if vocab < 4 * n * TOP_BLOCK:
        best, at = (base + allowed.double()).view(sent, K * vocab).topk(n)  # (sent, n)
        return best, at % vocab, at // vocab
    blocks = -(-vocab // TOP_BLOCK)
    tiled = F.pad(allowed, (0, blocks * TOP_BLOCK - vocab), value=-math.inf).view(rows, blocks, TOP_BLOCK)
    chosen = (base + tiled.amax(dim=-1).double()).view(sent, K * blocks).topk(n).indices   # (sent, n) best blocks
    row = torch.arange(sent, device=x.device)[:, None] * K + chosen // blocks               # (sent, n) their rows
    picked = tiled.reshape(rows * blocks, TOP_BLOCK).index_select(0, (row * blocks + chosen % blocks).view(-1))
    values = base.view(rows)[row][:, :, None] + picked.view(sent, n, TOP_BLOCK).double()     # (sent, n, TOP_BLOCK)
    best, at = values.view(sent, n * TOP_BLOCK).topk(n)                    # (sent, n)
    block = chosen.gather(1, at // TOP_BLOCK)                              # (sent, n) in [0, K * blocks)
    return best, (block % blocks) * TOP_BLOCK + at % TOP_BLOCK, block // blocks


def top_n(x: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """The n largest values of each row of x (rows, vocab), best first, and their ids: torch.topk's answer
    (up to the order of equal values), in two cheaper passes when the vocabulary is large. The n best of a
    row lie in the n blocks of TOP_BLOCK ids whose maxima are largest (any other block's best is beaten by
    n blocks, so by n values), so: the block maxima (one vectorised reduction), the n best blocks, then the
    n best of their n x TOP_BLOCK values."""
    rows, vocab = x.shape
    if vocab < 4 * n * TOP_BLOCK:
        return x.topk(min(n, vocab))
    blocks = -(-vocab // TOP_BLOCK)
    tiled = F.pad(x, (0, blocks * TOP_BLOCK - vocab), value=-math.inf).view(rows, blocks, TOP_BLOCK)
    chosen = tiled.amax(dim=-1).topk(n).indices                           # (rows, n) the best blocks
    inside = tiled.gather(1, chosen[:, :, None].expand(-1, -1, TOP_BLOCK)).view(rows, n * TOP_BLOCK)
    best, at = inside.topk(n)                                             # (rows, n) of n x TOP_BLOCK values
    return best, chosen.gather(1, at // TOP_BLOCK) * TOP_BLOCK + at % TOP_BLOCK
