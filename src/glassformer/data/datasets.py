"""Training and evaluation sets beyond the HSK corpus: Tatoeba (train / held-out), everyday sentences.

Rules (tests/test_datasets.py checks each on the real data):
- No evaluation sentence is ever trained on: every Tatoeba pair whose Chinese, compared by
  ``sources.match_key`` (Simplified, no spaces, slashes or punctuation), equals an HSK dev or test
  sentence, a probe sentence (the lesson's and the demo's) or an everyday sentence is dropped.
- A fixed Tatoeba slice is held out: all pairs whose md5(match_key(Chinese)) % 50 == 0, about 1,000
  distinct sentences; the held-out set scores one pair per distinct Chinese sentence (lowest ids).
- The everyday sentences (``glassformer/data/everyday.tsv``) were written for this project and are in
  no corpus; they only ever serve as a test.
"""

from __future__ import annotations

import hashlib
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from .corpus import LESSON_SENTENCES, CorpusSplits, Pair, load_corpus, short_gloss
from .sources import DictEntry, TatoebaPair, load_cedict, load_tatoeba, match_key
from .tokenize import is_han

# Sentences `make demo` and the lesson translate: never training data.
PROBE_SENTENCES: tuple[str, ...] = (*LESSON_SENTENCES, "你明天去学校吗？", "我喜欢喝茶。")
HELDOUT_BUCKETS = 50  # md5(match_key) % 50 == 0: held out
EVAL_SPLITS: tuple[str, ...] = ("dev", "test", "tatoeba", "everyday")
EVAL_SPLIT_HELP = "dev / test: HSK (fixed md5 split); tatoeba: the held-out Tatoeba slice; everyday: 20 own sentences"


def is_heldout(key: str) -> bool:
    """True if a Tatoeba sentence with this ``match_key`` belongs to the fixed held-out slice."""
    return int(hashlib.md5(key.encode("utf-8")).hexdigest(), 16) % HELDOUT_BUCKETS == 0


def load_everyday() -> list[Pair]:
    """The 20 everyday sentences with their references (``glassformer/data/everyday.tsv``)."""
    text = (resources.files("glassformer") / "data" / "everyday.tsv").read_text(encoding="utf-8")
    pairs = []
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            sid, zh, en = line.split("\t")
            pairs.append(Pair(sid, zh, en, []))
    return pairs


def evaluation_keys(hsk: CorpusSplits) -> set[str]:
    """Match keys of every sentence that must never be trained on."""
    sentences = [p.zh for p in (*hsk.dev, *hsk.test, *load_everyday())] + list(PROBE_SENTENCES)
    return {match_key(s) for s in sentences}


@dataclass
class TatoebaSplits:
    """Tatoeba pairs for training and the held-out slice, with counts of what was dropped."""

    train: list[Pair]
    heldout: list[Pair]
    report: dict[str, int] = field(default_factory=dict)


def split_tatoeba(pairs: Iterable[TatoebaPair], excluded: set[str]) -> TatoebaSplits:
    """Drop evaluation sentences (``excluded`` match keys), cut off the held-out slice; ids kept as Pair.id."""
    train: list[Pair] = []
    heldout: dict[str, Pair] = {}
    report = {"total": 0, "dropped_evaluation": 0, "heldout_pairs": 0}
    for p in pairs:
        report["total"] += 1
        key = match_key(p.zh, simplified=True)  # p.zh is the converted text
        if key in excluded:
            report["dropped_evaluation"] += 1
        elif is_heldout(key):
            report["heldout_pairs"] += 1
            heldout.setdefault(key, Pair(p.id, p.zh, p.en, []))
        else:
            train.append(Pair(p.id, p.zh, p.en, []))
    report.update(train=len(train), heldout=len(heldout))
    return TatoebaSplits(train, list(heldout.values()), report)


@lru_cache(maxsize=1)
def load_tatoeba_splits() -> TatoebaSplits:
    """The real Tatoeba data split against the real HSK evaluation sentences (cached per process)."""
    pairs = sorted(load_tatoeba(), key=lambda p: (p.cmn_id, p.eng_id))
    return split_tatoeba(pairs, evaluation_keys(load_corpus()))


def load_split(name: str) -> list[Pair]:
    """Evaluation pairs by name: HSK "dev" / "test", "tatoeba" (held out) or "everyday"."""
    if name in ("dev", "test"):
        return load_corpus().split(name)
    if name == "tatoeba":
        return load_tatoeba_splits().heldout
    if name == "everyday":
        return load_everyday()
    raise ValueError(f"unknown split {name!r}; expected one of {EVAL_SPLITS}")


# ---- dictionary -----------------------------------------------------------------------------
def dictionary_glosses(entries: Sequence[DictEntry] | None = None,
                       words: Container[str] | None = None) -> dict[str, str]:
    """Simplified headword -> short English gloss from CC-CEDICT (only headwords in ``words`` if given).

    Per headword the first entry with an informative sense wins, common-word entries (lower-case
    pinyin) before proper names (capitalised pinyin).
    """
    entries = load_cedict() if entries is None else entries
    if words is not None:
        entries = [e for e in entries if e.simplified in words]
    glosses: dict[str, str] = {}
    for proper in (False, True):
        for entry in entries:
            if entry.simplified in glosses or entry.pinyin[:1].isupper() != proper:
                continue
            gloss = short_gloss(";".join(entry.senses))
            if gloss:
                glosses[entry.simplified] = gloss
    return glosses


def dictionary_characters(entries: Sequence[DictEntry] | None = None) -> list[str]:
    """Every single-character Simplified headword of CC-CEDICT (about 13,000 Han characters), sorted."""
    entries = load_cedict() if entries is None else entries
    return sorted({e.simplified for e in entries if len(e.simplified) == 1 and is_han(e.simplified)})
