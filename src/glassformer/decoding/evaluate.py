"""sacreBLEU BLEU and chrF of a translator on a corpus split, with their signatures.

Input "raw": the Chinese text goes through the same segmentation a user's text does.
Input "gold": the corpus's own word segmentation (an upper bound on what segmentation costs).
Output is detokenized English, scored against the reference English as is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sacrebleu.metrics import BLEU, CHRF

from ..data.corpus import Pair
from .search import DEFAULT_ALPHA
from .translator import Translator

INPUTS = ("raw", "gold")


@dataclass
class Score:
    """Corpus-level scores of one evaluation and the hypotheses behind them."""

    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    sentences: int
    hypotheses: list[str] = field(default_factory=list)

    def to_dict(self, with_hypotheses: bool = False) -> dict:
        out = {"bleu": round(self.bleu, 2), "chrf": round(self.chrf, 2), "sentences": self.sentences,
               "bleu_signature": self.bleu_signature, "chrf_signature": self.chrf_signature}
        if with_hypotheses:
            out["hypotheses"] = self.hypotheses
        return out


def score(hypotheses: Sequence[str], references: Sequence[str]) -> Score:
    """sacreBLEU corpus BLEU (13a tokenization) and chrF, with signatures."""
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(list(hypotheses), [list(references)])
    c = chrf.corpus_score(list(hypotheses), [list(references)])
    return Score(b.score, c.score, str(bleu.get_signature()), str(chrf.get_signature()), len(hypotheses),
                 list(hypotheses))


def translate_pairs(translator: Translator, pairs: Sequence[Pair], input: str = "raw", beam: int = 1,
                    alpha: float = DEFAULT_ALPHA, max_length: int | None = None) -> list[str]:
    """English hypotheses for the Chinese side of `pairs`, raw text or gold units."""
    if input not in INPUTS:
        raise ValueError(f"input must be one of {INPUTS}, got {input!r}")
    if input == "gold":
        return translator.translate_units([p.zh_units for p in pairs], beam, alpha, max_length)
    return translator.translate([p.zh for p in pairs], beam, alpha, truncate=True, max_length=max_length)


def evaluate_pairs(translator: Translator, pairs: Sequence[Pair], input: str = "raw", beam: int = 1,
                   alpha: float = DEFAULT_ALPHA, max_length: int | None = None) -> Score:
    """Translate and score a list of pairs."""
    return score(translate_pairs(translator, pairs, input, beam, alpha, max_length), [p.en for p in pairs])
