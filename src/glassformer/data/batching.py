"""Token-count batches: length-bucketed, right-padded with PAD=0, deterministic per (seed, epoch).

Each epoch shuffles the examples, cuts them into large pools, sorts each pool by length and fills
batches up to `max_tokens` (padding included), then shuffles the batch order. For DDP the batch
list is padded to a multiple of the group size so every rank takes the same number of steps.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .tokenize import BOS, EOS, PAD, UNK


@dataclass
class Example:
    """One training pair as ids: source units and target sub-words, without BOS/EOS."""

    src: list[int]
    tgt: list[int]

    @property
    def width(self) -> int:
        """Row width this example needs in a batch: the longer of the source and the shifted target."""
        return max(len(self.src), len(self.tgt) + 1)


@dataclass
class Batch:
    """Padded tensors of one batch; `index` names the examples it holds."""

    src: Tensor     # (batch, src_len) source ids, PAD at the right
    tgt_in: Tensor  # (batch, tgt_len) BOS + target (right-shifted decoder input)
    labels: Tensor  # (batch, tgt_len) target + EOS (PAD where the row is shorter)
    index: list[int]

    @property
    def n_tokens(self) -> int:
        """Target tokens that count in the loss (non-PAD labels)."""
        return int((self.labels != PAD).sum())

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.src.to(device), self.tgt_in.to(device), self.labels.to(device), self.index)


def padded_size(examples: Sequence[Example], index: Sequence[int]) -> int:
    """Tokens a batch of these examples occupies: rows x the widest row (padding included)."""
    return len(index) * max(examples[i].width for i in index) if index else 0


def padded(sequences: Sequence[Sequence[int]], pad_id: int = PAD) -> Tensor:
    """Token id lists right-padded with `pad_id` into one (len(sequences), longest) long tensor: one tensor made
    from lists (a tensor per row and `pad_sequence` cost ~5x as much for 32 rows)."""
    longest = max(map(len, sequences), default=0)
    rows = [[*s, *[pad_id] * (longest - len(s))] for s in sequences]
    return torch.tensor(rows, dtype=torch.long).view(len(sequences), longest)           # (rows, longest)


def collate(examples: Sequence[Example], index: Sequence[int], pad_id: int = PAD) -> Batch:
    """Right-pad the chosen examples: src, tgt_in = BOS + target, labels = target + EOS."""
    rows = [examples[i] for i in index]
    src = padded([e.src for e in rows], pad_id)                     # (batch, src_len)
    tgt_in = padded([[BOS, *e.tgt] for e in rows], pad_id)          # (batch, tgt_len)
    labels = padded([[*e.tgt, EOS] for e in rows], pad_id)          # (batch, tgt_len)
    return Batch(src, tgt_in, labels, list(index))


def drop_words(src: Tensor, p: float, generator: torch.Generator | None = None) -> Tensor:
    """Word dropout (Sennrich & Zhang 2019): each source unit becomes <unk> with probability p; PAD stays."""
    if p <= 0:
        return src
    dropped = (torch.rand(src.shape, generator=generator) < p) & (src != PAD)   # (batch, src_len)
    return src.masked_fill(dropped, UNK)


def make_batches(examples: Sequence[Example], max_tokens: int, seed: int, epoch: int,
                 pool_size: int = 8192) -> list[list[int]]:
    """Example indices grouped into batches of at most `max_tokens` padded tokens.

    Deterministic given (seed, epoch). Every example appears exactly once; one example wider than
    `max_tokens` forms a batch of its own.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(len(examples)))
    rng.shuffle(order)
    batches: list[list[int]] = []
    for start in range(0, len(order), pool_size):
        pool = sorted(order[start: start + pool_size],
                      key=lambda i: (examples[i].width, len(examples[i].src), len(examples[i].tgt)))
        current: list[int] = []
        widest = 0
        for i in pool:
            w = max(widest, examples[i].width)
            if current and (len(current) + 1) * w > max_tokens:
                batches.append(current)
                current, w = [], examples[i].width
            current.append(i)
            widest = w
        if current:
            batches.append(current)
    rng.shuffle(batches)
    return batches


def pad_to_multiple(batches: list[list[int]], multiple: int) -> list[list[int]]:
    """Repeat batches from the start until the count is a multiple of `multiple` (DDP equal steps)."""
    if multiple <= 1 or not batches:
        return list(batches)
    short = -len(batches) % multiple
    return list(batches) + [batches[i % len(batches)] for i in range(short)]


def step_groups(batches: list[list[int]], world_size: int = 1, accumulate: int = 1) -> list[list[list[int]]]:
    """The batch list cut into optimizer steps: each step holds world_size x accumulate batches.

    Rank r takes `group[r * accumulate:(r + 1) * accumulate]` of every step (see `rank_share`), so
    all ranks take the same number of steps and together see the same data as one process would.
    """
    size = world_size * accumulate
    padded = pad_to_multiple(batches, size)
    return [padded[s: s + size] for s in range(0, len(padded), size)]


def rank_share(group: list[list[int]], rank: int, accumulate: int) -> list[list[int]]:
    """The micro-batches rank `rank` runs within one step group."""
    return group[rank * accumulate: (rank + 1) * accumulate]
