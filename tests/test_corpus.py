"""Corpus cleaning, fixed md5 split and gold segmentation of the hsk-sentences-audio pairs."""

from __future__ import annotations

import hashlib

import pytest

from glassformer.data.corpus import (
    LESSON_SENTENCES,
    CorpusSplits,
    clean_records,
    gold_units,
    load_corpus,
    short_gloss,
    split_of,
    train_glosses,
)


@pytest.fixture(scope="module")
def corpus() -> CorpusSplits:
    return load_corpus()


def _record(rid: str, zh: str, en: str, words: list[str]) -> dict:
    return {"id": rid, "chinese": zh, "translation": {"en": en}, "tokens": [{"word": w} for w in words]}


def test_split_counts_and_report(corpus: CorpusSplits) -> None:
    # 65 records read "placeholder", 15 more "placeholder-p1" ... "placeholder-p14" and "placeholder-q1"
    assert (len(corpus.train), len(corpus.dev), len(corpus.test)) == (3812, 232, 228)
    assert corpus.report == {"total": 4354, "dropped_placeholder": 80, "dropped_empty": 0,
                             "dropped_lesson": 0, "dropped_duplicate": 2, "kept": 4272,
                             "train": 3812, "dev": 232, "test": 228}


def test_split_is_the_md5_rule(corpus: CorpusSplits) -> None:
    def bucket(rid: str) -> int:  # recomputed here, independently of the library
        return int(hashlib.md5(rid.encode()).hexdigest(), 16) % 20

    for name, allowed in (("train", range(18)), ("dev", [18]), ("test", [19])):
        assert all(bucket(p.id) in allowed for p in corpus.split(name)), name
    ids = {name: {p.id for p in corpus.split(name)} for name in ("train", "dev", "test")}
    for rid in ("hsk1-0001", "hsk1-0002", "hsk3-0550", "hsk4-0150"):
        expected = "train" if bucket(rid) < 18 else ("dev" if bucket(rid) == 18 else "test")
        assert split_of(rid) == expected and rid in ids[expected]
    again = load_corpus()
    assert [p.id for p in again.test] == [p.id for p in corpus.test]
    assert not (ids["train"] & ids["dev"] or ids["train"] & ids["test"] or ids["dev"] & ids["test"])


def test_cleaning_drops_placeholders_empty_duplicates_and_lessons() -> None:
    records = [
        _record("a", "你好。", "Hello.", ["你好"]),
        _record("b", "谢谢。", "placeholder", ["谢谢"]),
        _record("c", "再见。", "  PlaceHolder ", ["再见"]),
        _record("c2", "再见！", "placeholder-p3", ["再见"]),
        _record("c3", "好的。", "placeholder-q1", ["好的"]),
        _record("c4", "好吧。", "The placeholder-p3 is here.", ["好吧"]),  # a real sentence: kept
        _record("d", "对。", "   ", ["对"]),
        _record("e", "你好。", "Hello.", ["你好"]),  # exact duplicate of "a": dropped, "a" kept
        _record("f", "你好。", "Hi.", ["你好"]),  # same Chinese, other English: kept
        _record("g", LESSON_SENTENCES[0], "I gave him a book yesterday.", ["我"]),
    ]
    kept, report = clean_records(records)
    assert [r["id"] for r in kept] == ["a", "c4", "f"]
    assert report == {"total": 10, "dropped_placeholder": 4, "dropped_empty": 1, "dropped_lesson": 1,
                      "dropped_duplicate": 1, "kept": 3}
    splits = load_corpus(records)
    assert sorted(p.id for name in ("train", "dev", "test") for p in splits.split(name)) == ["a", "c4", "f"]


def test_no_placeholder_or_lesson_sentence_survives(corpus: CorpusSplits) -> None:
    pairs = corpus.train + corpus.dev + corpus.test
    assert all(p.en.strip() and "placeholder" not in p.en.lower() for p in pairs)
    ids = {name: {p.id for p in corpus.split(name)} for name in ("train", "dev", "test")}
    assert "hsk4-0531" not in ids["test"] and "hsk4-0652" not in ids["dev"]  # were placeholder-p3 / -p7
    assert not {p.zh for p in pairs} & set(LESSON_SENTENCES)


def test_gold_units_reinsert_punctuation(corpus: CorpusSplits) -> None:
    assert gold_units("老师，您好！", ["老师", "您", "好"]) == ["老师", "，", "您", "好", "！"]
    first = next(p for p in corpus.train + corpus.dev + corpus.test if p.id == "hsk1-0002")
    assert first.zh_units == ["你", "好", "，", "很", "高兴", "认识", "你", "。"]
    for p in corpus.train + corpus.dev + corpus.test:
        assert "".join(p.zh_units) == p.zh.replace(" ", "")
    with pytest.raises(ValueError):
        gold_units("你好。", ["再见"])


def test_short_gloss() -> None:
    assert short_gloss("to be (followed by substantives only); correct; right") == "to be"
    assert short_gloss("surname Gu; ancient; old") == "ancient"
    assert short_gloss("(line of) thought; thinking") == "thought"
    assert short_gloss("") is None


def test_glosses_come_from_train_only(corpus: CorpusSplits) -> None:
    from hsk_sentences_audio import load_sentences

    records = {r["id"]: r for r in load_sentences()}
    train_words = {t["word"] for p in corpus.train for t in records[p.id]["tokens"]}
    heldout_words = {t["word"] for p in corpus.dev + corpus.test for t in records[p.id]["tokens"]}
    heldout_only = heldout_words - train_words
    glosses = train_glosses(corpus)
    assert glosses["老师"] == "teacher"
    assert set(glosses) <= train_words
    assert len(heldout_only) > 100 and not (set(glosses) & heldout_only)
