"""The Chinese→English corpus: the `hsk-sentences-audio` records, cleaned and split.

Data: hsk-sentences-audio (PyPI), licence CC-BY-SA-4.0. Cleaning is rule-based and every dropped
record is counted in ``CorpusSplits.report``; the split is a fixed hash of the record id, so it never
depends on load order or on which other records survive cleaning.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Sentences the lesson translates live; they must never be training data (none are in the corpus,
# and ``clean_records`` drops them should a future dataset version contain them).
from ..lesson.examples import LESSON_SENTENCES

# English the dataset uses for a missing translation: "placeholder", also numbered ("placeholder-p3", "placeholder-q1").
PLACEHOLDER = re.compile(r"placeholder(-[a-z]\d+)?", re.IGNORECASE)
SPLIT_BUCKETS = 20  # md5(id) % 20: buckets 0-17 train, 18 dev, 19 test
SPLIT_NAMES: tuple[str, ...] = ("train", "dev", "test")


@dataclass
class Pair:
    """One sentence pair: raw Chinese, English, and the corpus's own word segmentation."""

    id: str
    zh: str
    en: str
    zh_units: list[str]  # corpus tokens with the punctuation re-inserted, in order; "".join == zh


@dataclass
class CorpusSplits:
    """Cleaned corpus split into train/dev/test, plus counts of what cleaning kept and dropped."""

    train: list[Pair]
    dev: list[Pair]
    test: list[Pair]
    report: dict[str, int] = field(default_factory=dict)

    def split(self, name: str) -> list[Pair]:
        """Return the split called ``name`` ("train", "dev" or "test")."""
        if name not in SPLIT_NAMES:
            raise ValueError(f"unknown split {name!r}; expected one of {SPLIT_NAMES}")
        return getattr(self, name)


def split_of(sentence_id: str) -> str:
    """Fixed split of a record: md5 of its id, as an integer, modulo 20 (0-17 train, 18 dev, 19 test)."""
    bucket = int(hashlib.md5(sentence_id.encode("utf-8")).hexdigest(), 16) % SPLIT_BUCKETS
    return "train" if bucket < 18 else ("dev" if bucket == 18 else "test")


def gold_units(chinese: str, words: Sequence[str], sentence_id: str = "?") -> list[str]:
    """Align the corpus tokens against the raw sentence; characters between them (punctuation) become units.

    The packaged tokens omit punctuation, so we walk the raw string: each token must appear next in
    order; every skipped non-space character is its own unit. Raises ValueError if a token is missing.
    """
    units: list[str] = []
    pos = 0
    for word in words:
        found = chinese.find(word, pos)
        if found < 0:
            raise ValueError(f"{sentence_id}: token {word!r} not found in {chinese!r} after position {pos}")
        units.extend(ch for ch in chinese[pos:found] if not ch.isspace())
        units.append(word)
        pos = found + len(word)
    units.extend(ch for ch in chinese[pos:] if not ch.isspace())
    return units


def _english(record: Mapping[str, Any]) -> str:
    return ((record.get("translation") or {}).get("en") or "").strip()


def clean_records(records: Iterable[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], dict[str, int]]:
    """Drop placeholder English (``placeholder``, ``placeholder-p3``), empty text, lesson sentences and
    exact (chinese, english) duplicates; count each.

    Rules are applied in that order; for duplicates the first record (in package order) is kept.
    """
    kept: list[Mapping[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    report = {"total": 0, "dropped_placeholder": 0, "dropped_empty": 0, "dropped_lesson": 0,
              "dropped_duplicate": 0}
    for record in records:
        report["total"] += 1
        zh, en = record["chinese"].strip(), _english(record)
        if PLACEHOLDER.fullmatch(en):
            report["dropped_placeholder"] += 1
        elif not en or not zh:
            report["dropped_empty"] += 1
        elif zh in LESSON_SENTENCES:
            report["dropped_lesson"] += 1
        elif (zh, en) in seen:
            report["dropped_duplicate"] += 1
        else:
            seen.add((zh, en))
            kept.append(record)
    report["kept"] = len(kept)
    return kept, report


def _load_records() -> list[dict[str, Any]]:
    from hsk_sentences_audio import load_sentences  # imported lazily: only the corpus path needs it

    return load_sentences()


def load_corpus(records: Iterable[Mapping[str, Any]] | None = None) -> CorpusSplits:
    """Load (by default the packaged 4,354 records), clean, and split into train/dev/test ``Pair`` lists."""
    cleaned, report = clean_records(_load_records() if records is None else records)
    splits: dict[str, list[Pair]] = {name: [] for name in SPLIT_NAMES}
    for record in cleaned:
        zh = record["chinese"].strip()
        units = gold_units(zh, [t["word"] for t in record["tokens"]], record["id"])
        splits[split_of(record["id"])].append(Pair(record["id"], zh, _english(record), units))
    report.update({name: len(pairs) for name, pairs in splits.items()})
    return CorpusSplits(splits["train"], splits["dev"], splits["test"], report)


# CC-CEDICT senses that say nothing about the word's meaning in a sentence.
_UNINFORMATIVE_SENSE = re.compile(
    r"^(surname |variant of |old variant of |used in |see |also written |abbr\. for |CL:)", re.IGNORECASE
)


def short_gloss(gloss_en: str) -> str | None:
    """First informative CC-CEDICT sense, parentheses removed: "to be (followed by...); correct" -> "to be".

    Skips senses such as "surname Gu" or "variant of ..."; returns None if nothing is left.
    """
    for sense in gloss_en.split(";"):
        previous = None
        while previous != sense:  # remove (possibly nested) parenthetical remarks
            previous, sense = sense, re.sub(r"\([^()]*\)", "", sense)
        sense = " ".join(sense.split()).strip(" ,")
        if sense and not _UNINFORMATIVE_SENSE.match(sense):
            return sense
    return None


def train_glosses(corpus: CorpusSplits | None = None,
                  records: Sequence[Mapping[str, Any]] | None = None) -> dict[str, str]:
    """Word -> short English gloss, from the tokens of **train-split** records only (dev/test never leak).

    Intended as optional extra word-level training pairs. Words with no informative gloss are left out.
    """
    corpus = corpus if corpus is not None else load_corpus(records)
    train_ids = {pair.id for pair in corpus.train}
    glosses: dict[str, str] = {}
    for record in _load_records() if records is None else records:
        if record["id"] not in train_ids:
            continue
        for token in record["tokens"]:
            word = token["word"]
            if word not in glosses:
                gloss = short_gloss(token.get("gloss_en") or "")
                if gloss:
                    glosses[word] = gloss
    return glosses
