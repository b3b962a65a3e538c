"""The work every system does: one model size, identical batches, the same corpus sentences.

Sizes (issue 5): d_model 256, 4 heads, d_ff 1024, 3+3 layers, 8000 ids on each side, target
embedding tied to the output layer, post-norm, ReLU, sinusoidal positions, dropout 0.1 in training.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

PAD, BOS, EOS = 0, 1, 2
FIRST_WORD = 4          # ids 0..3 are PAD, BOS, EOS, UNK


@dataclass(frozen=True)
class Spec:
    """Model sizes shared by the three systems."""

    vocab: int = 8000
    d_model: int = 256
    heads: int = 4
    d_ff: int = 1024
    layers: int = 3
    dropout: float = 0.1
    max_len: int = 512
    lr: float = 3e-4

    def to_dict(self) -> dict:
        return asdict(self)


SPEC = Spec()


@dataclass
class Pairs:
    """A right-padded batch: src (batch, S), tgt_in = BOS + target (batch, T), labels = target + EOS."""

    src: Tensor
    tgt_in: Tensor
    labels: Tensor

    @property
    def n_tokens(self) -> int:
        """Real target tokens: non-PAD labels (what tokens/s counts)."""
        return int((self.labels != PAD).sum())


def pad_pairs(pairs: list[tuple[list[int], list[int]]]) -> Pairs:
    """Right-pad (source ids, target ids) pairs into src, tgt_in = BOS + tgt, labels = tgt + EOS."""
    n_src = max(len(s) for s, _ in pairs)
    n_tgt = max(len(t) for _, t in pairs) + 1
    src = torch.full((len(pairs), n_src), PAD, dtype=torch.long)            # (batch, S)
    tgt_in = torch.full((len(pairs), n_tgt), PAD, dtype=torch.long)         # (batch, T)
    labels = torch.full((len(pairs), n_tgt), PAD, dtype=torch.long)         # (batch, T)
    for r, (s, t) in enumerate(pairs):
        src[r, : len(s)] = torch.tensor(s)
        tgt_in[r, : len(t) + 1] = torch.tensor([BOS, *t])
        labels[r, : len(t) + 1] = torch.tensor([*t, EOS])
    return Pairs(src, tgt_in, labels)


def random_pairs(n: int, seed: int, lengths: tuple[int, int] = (4, 14),
                 vocab: int = SPEC.vocab) -> list[tuple[list[int], list[int]]]:
    """n (source, target) id lists, each side 4..14 ids long (inclusive), seeded."""
    rng = random.Random(seed)
    lo, hi = lengths

    def ids() -> list[int]:
        return [rng.randrange(FIRST_WORD, vocab) for _ in range(rng.randint(lo, hi))]

    return [(ids(), ids()) for _ in range(n)]


def training_batches(count: int = 8, batch: int = 64, seed: int = 0) -> list[Pairs]:
    """`count` identical-for-everyone padded batches of `batch` random pairs (lengths 4-14)."""
    return [pad_pairs(random_pairs(batch, seed * 1000 + i)) for i in range(count)]


def decoding_source(batch: int, length: int = 12, seed: int = 0) -> Tensor:
    """(batch, length) source ids without padding, for the decoding cases."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(FIRST_WORD, SPEC.vocab, (batch, length), generator=g)


# ---- the corpus ----------------------------------------------------------------------------------
def corpus_pairs(limit: int | None = None, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """HSK train-split pairs as ids: source word units, English BPE sub-words (glassformer tokenizers).

    `limit` keeps a seeded random subset (the same one for every system).
    """
    from glassformer.data.corpus import load_corpus
    from glassformer.data.tokenize import SourceTokenizer, TargetTokenizer

    train = load_corpus().train
    source = SourceTokenizer.train(p.zh_units for p in train)
    target = TargetTokenizer.train(p.en for p in train)
    pairs = [(source.vocab.encode(p.zh_units), target.encode(p.en)) for p in train]
    pairs = [(s, t) for s, t in pairs if s and t]
    if limit is not None and limit < len(pairs):
        pairs = random.Random(seed).sample(pairs, limit)
    if max(max(max(s), max(t)) for s, t in pairs) >= SPEC.vocab:
        raise ValueError(f"corpus ids exceed the benchmark vocabulary {SPEC.vocab}")
    return pairs


def fixed_size_batches(pairs: list[tuple[list[int], list[int]]], batch: int, seed: int) -> list[Pairs]:
    """What a typical user does: shuffle, cut into batches of `batch` pairs, pad each to its longest."""
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    return [pad_pairs([pairs[i] for i in order[s: s + batch]]) for s in range(0, len(order), batch)]


def bucketed_batches(pairs: list[tuple[list[int], list[int]]], max_tokens: int, seed: int) -> list[Pairs]:
    """glassformer's token-count length bucketing (glassformer.data.batching.make_batches)."""
    from glassformer.data.batching import Example, make_batches

    examples = [Example(s, t) for s, t in pairs]
    groups = make_batches(examples, max_tokens=max_tokens, seed=seed, epoch=0)
    return [pad_pairs([pairs[i] for i in g]) for g in groups]


def bucket_budget(pairs: list[tuple[list[int], list[int]]], batch: int) -> int:
    """Token budget giving about as many bucketed batches as fixed batches of `batch` pairs."""
    mean_width = sum(max(len(s), len(t) + 1) for s, t in pairs) / len(pairs)
    return int(round(batch * mean_width))
