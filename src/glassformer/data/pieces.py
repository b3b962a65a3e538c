"""BPE-dropout (Provilkov et al. 2020) for the training targets: `PieceDropout` over a trained TargetTokenizer,
and `cut_step`, the targets of one optimizer step cut again (`glassformer train --bpe-dropout p`)."""

from __future__ import annotations

import json
import random
import string
import unicodedata
from collections.abc import Sequence

from .batching import Example
from .tokenize import UNK, TargetTokenizer


class PieceDropout:
    """BPE-dropout (Provilkov et al. 2020) over a trained `TargetTokenizer`: each word of a target sentence is
    merged again from its characters, every merge that could apply skipped with probability p at each step, so
    a word is sometimes cut into smaller pieces of the same vocabulary (p = 0: exactly the tokenizer's pieces).

    Works on ids: a word is a piece starting with "▁", or one punctuation mark, with the pieces that follow it
    (BPE never merges across the pre-tokenizer's cuts). A word holding <unk> stays as it is. `seed` decides the
    cuts, so the same (ids, p, seed) give the same pieces in every process and after a resume.
    """

    def __init__(self, tokenizer: TargetTokenizer) -> None:
        model = json.loads(tokenizer.to_str())["model"]
        self.ids: dict[str, int] = model["vocab"]                                 # piece -> id
        self.pieces = {i: piece for piece, i in self.ids.items()}
        self.ranks = {(tuple(m.split(" ")) if isinstance(m, str) else tuple(m)): rank
                      for rank, m in enumerate(model["merges"])}                   # (left, right) -> rank

    def words(self, ids: Sequence[int]) -> list[list[int]]:
        """The ids grouped into the pre-tokenizer's words."""
        words: list[list[int]] = []
        after_mark = True
        for i in ids:
            piece = self.pieces.get(i, "")
            mark = len(piece) == 1 and _is_mark(piece)
            if after_mark or mark or piece.startswith("▁"):
                words.append([i])
            else:
                words[-1].append(i)
            after_mark = mark
        return words

    def __call__(self, ids: Sequence[int], p: float, seed: int | str) -> list[int]:
        rng = random.Random(seed)
        out: list[int] = []
        for word in self.words(ids):
            if UNK in word or len(word) == 1 and len(self.pieces.get(word[0], "")) <= 1:
                out += word                                                       # nothing to cut
            else:
                out += self._merged("".join(self.pieces[i] for i in word), p, rng)
        return out

    def _merged(self, word: str, p: float, rng: random.Random) -> list[int]:
        parts = list(word)                                                        # characters, then merges
        while len(parts) > 1:
            best = None                                                           # (rank, position)
            for j in range(len(parts) - 1):
                rank = self.ranks.get((parts[j], parts[j + 1]))
                if rank is not None and (best is None or rank < best[0]) and (p <= 0 or rng.random() >= p):
                    best = (rank, j)
            if best is None:
                break
            j = best[1]
            parts[j: j + 2] = [parts[j] + parts[j + 1]]
        return [self.ids[part] for part in parts]


def _is_mark(ch: str) -> bool:
    """A character the target pre-tokenizer cuts off on its own (ASCII or Unicode punctuation)."""
    return ch in string.punctuation or unicodedata.category(ch).startswith("P")


def cut_step(examples: Sequence[Example], group: list[list[int]], cutter: PieceDropout, p: float, seed: str,
             max_len: int) -> dict[int, Example]:
    """The examples of every batch of a step, each target cut again with `cutter` (seeded by `seed` and the
    example's index: every DDP rank and a resumed run cut alike); a cut that would pass max_len (with BOS / EOS)
    keeps the tokenizer's pieces."""
    out = {}
    for i in (i for batch in group for i in batch):
        e = examples[i]
        tgt = cutter(e.tgt, p, f"{seed}:{i}")
        out[i] = Example(e.src, tgt) if len(tgt) < max_len else e
    return out
