"""Finished hypotheses: what a search keeps of each sentence (decoding/search.py), the n best by length-penalised
score."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Hypothesis:
    """A finished beam: generated ids (EOS excluded), summed log-prob, its length-penalised score (both NaN from
    Greedy(scores=False)), and whether it ended with EOS (False: cut at the output limit)."""

    tokens: list[int]
    score: float
    normalized: float
    finished: bool = True


class Finished:
    """One sentence's n best finished hypotheses, best first (the earlier one first among equals)."""

    def __init__(self, n: int) -> None:
        self.n, self.best = n, []
        self.top = False              # a step's best candidate has ended a hypothesis (STOP_RULES "top")
        self.count = 0                # hypotheses finished so far, kept or not (STOP_RULES "full")

    def add(self, hyp: Hypothesis) -> float:
        """Keep `hyp` if it is among the n best; the n-th best normalised score (-inf while fewer than n)."""
        self.count += 1
        self.best.append(hyp)
        self.best.sort(key=lambda h: -h.normalized)                          # stable: earlier wins ties
        del self.best[self.n:]
        return self.best[-1].normalized if len(self.best) == self.n else -math.inf

    def result(self) -> list[Hypothesis]:
        return self.best or [Hypothesis([], -math.inf, -math.inf, False)]
