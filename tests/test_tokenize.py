"""Source (Chinese units) and target (English BPE) tokenizers: splitting, UNK handling, serialisation."""

from __future__ import annotations

import json
import time

import pytest

from glassformer.data.corpus import LESSON_SENTENCES, CorpusSplits, load_corpus
from glassformer.data.tokenize import (
    BOS,
    EOS,
    PAD,
    SPECIAL_TOKENS,
    UNK,
    SourceTokenizer,
    TargetTokenizer,
    Vocab,
)

LESSON_UNITS = ["我", "昨天", "给", "了", "他", "一", "本", "书", "。"]


@pytest.fixture(scope="module")
def corpus() -> CorpusSplits:
    return load_corpus()


@pytest.fixture(scope="module")
def src(corpus: CorpusSplits) -> SourceTokenizer:
    return SourceTokenizer.train(p.zh_units for p in corpus.train)


@pytest.fixture(scope="module")
def tgt(corpus: CorpusSplits) -> TargetTokenizer:
    return TargetTokenizer.train((p.en for p in corpus.train), vocab_size=2000)


# ---------------------------------------------------------------- source side
@pytest.mark.parametrize("typed", [
    "我／昨天／给／了／他／一／本／书／。",
    "我/昨天/给/了/他/一/本/书/。",
    "我 昨天 给 了 他 一 本 书 。",
    "  我　昨天／ 给 /了 他 一 本 书。 ",  # ideographic space, mixed separators, punctuation glued on
])
def test_separator_input_splits_exactly(src: SourceTokenizer, typed: str) -> None:
    enc = src.analyse(typed)
    assert enc.units == LESSON_UNITS and enc.presegmented
    assert enc.unknown == [] and UNK not in enc.ids


def test_separators_win_over_the_segmenter(src: SourceTokenizer) -> None:
    # the typed boundaries hold even where the segmenter would cut elsewhere ("昨天" is a known word) ...
    assert src.analyse("我 昨 天给").units == ["我", "昨", "天", "给"]
    # ... and a typed piece that is no known unit is cut further, not read as <unk>
    enc = src.analyse("我 昨天 给了")
    assert enc.units == ["我", "昨天", "给", "了"] and enc.unknown == [] and UNK not in enc.ids


@pytest.mark.parametrize("sentence", LESSON_SENTENCES)
def test_lesson_sentences_segment_into_known_units(src: SourceTokenizer, sentence: str) -> None:
    enc = src.analyse(sentence)
    assert "".join(enc.units) == sentence and len(enc.units) == 9 and enc.unknown == []
    assert not enc.presegmented
    assert sorted(enc.units) == sorted(LESSON_UNITS)


def test_punctuation_units(src: SourceTokenizer) -> None:
    assert src.segment("老师，您好！") == ["老师", "，", "您", "好", "！"]
    assert src.segment("你好?") == ["你", "好", "？"]  # ASCII '?' -> the corpus's '？'
    assert src.segment("我很好.") == ["我", "很", "好", "。"]
    assert src.segment("好!!") == ["好", "！", "！"]
    assert src.segment("3.5") == ["3", ".", "5"]


def test_unknowns_map_to_unk_and_are_reported(src: SourceTokenizer) -> None:
    assert src.analyse("") == src.analyse("   ") and src.encode("") == []
    emoji = src.analyse("我爱😀")
    assert emoji.units == ["我", "爱", "😀"] and emoji.unknown == ["😀"] and emoji.ids[-1] == UNK
    latin = src.analyse("hello world")
    assert latin.units == ["hello", "world"] and latin.ids == [UNK, UNK]
    mixed = src.analyse("我用iPhone打电话")
    assert mixed.units == ["我", "用", "iPhone", "打电话"] and mixed.unknown == ["iPhone"]
    assert src.unknown_units("龘龘") == ["龘", "龘"]  # a Han character never seen in training
    assert src.encode("我", add_bos_eos=True) == [BOS, src.vocab.token_to_id("我"), EOS]


def test_very_long_input_is_fast(src: SourceTokenizer) -> None:
    start = time.perf_counter()
    ids = src.encode("我昨天给了他一本书。" * 2000)
    assert len(ids) == 9 * 2000 and UNK not in ids
    assert time.perf_counter() - start < 5.0


def test_segmenter_agreement_with_corpus(corpus: CorpusSplits, src: SourceTokenizer) -> None:
    # Measured numbers documented in docs/data.md (default mode: unigram over the training vocabulary).
    assert sum(src.segment(p.zh) == p.zh_units for p in corpus.train) == 3797
    assert sum(src.segment(p.zh) == p.zh_units for p in corpus.test) == 93
    seen = [p for p in corpus.test if all(u in src.vocab for u in p.zh_units)]
    assert len(seen) == 67 and all(src.segment(p.zh) == p.zh_units for p in seen)
    assert sum(u not in src.vocab for p in corpus.test for u in src.segment(p.zh)) == 136


def _reference_segmenter(src: SourceTokenizer):
    """The source segmentation written plainly (the spec the fast one must equal, units for units): punctuation
    normalised character by character, each character classed by its own calls, every word of length 1..max_len
    ending at each position tried (jieba's dynamic programming, ties to the longer last word)."""
    import math
    import re
    import unicodedata

    def han(ch):
        c = ord(ch)
        return 0x4E00 <= c <= 0x9FFF or 0x3400 <= c <= 0x4DBF or 0xF900 <= c <= 0xFAFF or 0x20000 <= c <= 0x323AF

    marks = {",": "，", "!": "！", "?": "？", ";": "；", ":": "：", "(": "（", ")": "）"}
    words = {w: src.vocab.counts.get(w, 1) for w in src.vocab.tokens[4:] if all(han(c) for c in w)}
    total = sum(words.values()) or 1
    logp, unknown, longest = {w: math.log(c / total) for w, c in words.items()}, math.log(0.5 / total), \
        max(map(len, words), default=1)

    def cut(run):
        best = [(0.0, 0)] + [(-math.inf, 1)] * len(run)
        for end in range(1, len(run) + 1):
            for n in range(1, min(longest, end) + 1):
                lp = logp.get(run[end - n:end], unknown if n == 1 else None)
                if lp is not None and best[end - n][0] + lp >= best[end][0]:
                    best[end] = (best[end - n][0] + lp, n)
        out, end = [], len(run)
        while end:
            out.append(run[end - best[end][1]:end])
            end -= best[end][1]
        return out[::-1]

    def kind(ch):
        if unicodedata.category(ch) in ("Cc", "Cf") or "\ufe00" <= ch <= "\ufe0f" or ch.isspace():
            return "gap"
        return "punct" if unicodedata.category(ch)[0] in "PS" else "han" if han(ch) else "other"

    def units(text: str) -> list[str]:
        text = text.strip()
        text = "".join(marks.get(c, c) for c in ("。" if ch == "." and i and han(text[i - 1]) else ch
                                                 for i, ch in enumerate(text)))
        typed, out = re.search(r"[／/\s]+", text) is not None, []
        for piece in re.split(r"[／/\s]+", text) if typed else [text]:
            runs, prev, buf = [], "", ""
            for ch in piece:
                k = kind(ch)
                if (k != prev or k == "punct") and buf:
                    runs.append((buf, prev == "han"))
                buf = "" if k != prev or k == "punct" else buf
                buf += ch if k != "gap" else ""
                prev = k
            runs += [(buf, prev == "han")] if buf else []
            out += [u for run, h in runs for u in (cut(run) if h and not (typed and run in src.vocab) else [run])]
        return out

    return units


def test_the_segmenter_equals_its_plain_statement(corpus: CorpusSplits, src: SourceTokenizer) -> None:
    """The fast paths (a character's class looked up once, words tried until a piece ends none, punctuation by a
    table) cut every HSK sentence and thousands of made-up strings as the plain algorithm does: known words, unknown
    characters, typed separators, ASCII and full-width marks, '.' after Han and after Latin, emoji, joiners, digits."""
    import random

    rng = random.Random(7)
    words = [w for w in src.vocab.tokens[4:] if len(w) > 1][:3000]
    pieces = words + list("我昨天给了他一本书龘鑫犇。，.,!?;:()（）「」/／ 　\u200d\ufe0f\u0007abcXYZ0123４５😀€$%-")
    texts = [p.zh for p in corpus.train + corpus.dev + corpus.test]
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 30))) for _ in range(3000)]
    reference = _reference_segmenter(src)
    differ = [t for t in texts if src.segment(t) != reference(t)]
    assert differ == [], differ[:5]


def test_other_modes(src: SourceTokenizer) -> None:
    char = SourceTokenizer(src.vocab, "char")
    assert char.segment("我昨天。") == ["我", "昨", "天", "。"]
    assert SourceTokenizer(src.vocab, "fmm").segment("我昨天给了他一本书。") == LESSON_UNITS
    assert SourceTokenizer(src.vocab, "bmm").segment("我昨天给了他一本书。") == LESSON_UNITS
    with pytest.raises(ValueError):
        SourceTokenizer(src.vocab, "jieba")


def test_vocab_specials_min_freq_and_json_round_trip() -> None:
    vocab = Vocab.build([["我", "你", "我"], ["我", "书"]], min_freq=2)
    assert vocab.tokens == [*SPECIAL_TOKENS, "我"] and (PAD, BOS, EOS, UNK) == (0, 1, 2, 3)
    assert vocab.encode(["我", "你"]) == [4, UNK] and "你" not in vocab and "<pad>" not in vocab
    assert vocab.decode([BOS, 4, UNK, EOS, PAD]) == ["我", "<unk>"]
    restored = Vocab.from_dict(json.loads(json.dumps(vocab.to_dict())))
    assert restored.tokens == vocab.tokens and restored.counts == {"我": 3}
    with pytest.raises(ValueError):
        Vocab.from_dict({"tokens": ["我", "<pad>"]})


def test_source_tokenizer_json_round_trip(corpus: CorpusSplits, src: SourceTokenizer) -> None:
    restored = SourceTokenizer.from_dict(json.loads(json.dumps(src.to_dict(), ensure_ascii=False)))
    assert restored.mode == src.mode and restored.vocab_size == src.vocab_size == 4907
    texts = [p.zh for p in corpus.dev] + [*LESSON_SENTENCES, "我／昨天／给", "我爱😀"]
    assert [restored.encode(t) for t in texts] == [src.encode(t) for t in texts]


# ---------------------------------------------------------------- target side
ENGLISH = [
    "I gave him a book yesterday.",
    "He gave me a book yesterday.",
    "Don't worry; the doctor is coming right away.",
    "This coat is 20% off.",
    'She said "hello" to me, then left!',
    "What's the date today?",
]


@pytest.mark.parametrize("sentence", ENGLISH)
def test_english_round_trip(tgt: TargetTokenizer, sentence: str) -> None:
    ids = tgt.encode(sentence)
    assert UNK not in ids
    assert tgt.decode(ids) == sentence
    assert tgt.decode([BOS, *ids, EOS, PAD, PAD, 7, 8]) == sentence  # stops at EOS, drops specials


def test_english_tokens_split_punctuation(tgt: TargetTokenizer) -> None:
    assert tgt.tokens("I gave him a book yesterday.")[-2:] == ["▁yesterday", "."]
    assert tgt.encode("Hi", add_bos_eos=True)[0] == BOS and tgt.encode("Hi", add_bos_eos=True)[-1] == EOS


def test_english_specials_and_size(corpus: CorpusSplits, tgt: TargetTokenizer) -> None:
    assert [tgt.id_to_token(i) for i in range(4)] == list(SPECIAL_TOKENS)
    assert tgt.token_to_id("<unk>") == UNK and tgt.vocab_size == 2000
    round_trips = sum(tgt.decode(tgt.encode(p.en)) == p.en for p in corpus.dev)
    assert round_trips >= 231  # the misses contain characters never seen in train English (e.g. 'é')


def test_target_tokenizer_json_round_trip(corpus: CorpusSplits, tgt: TargetTokenizer) -> None:
    restored = TargetTokenizer.from_dict(json.loads(json.dumps(tgt.to_dict())))
    texts = ENGLISH + [p.en for p in corpus.dev]
    assert [restored.encode(t) for t in texts] == [tgt.encode(t) for t in texts]
    assert TargetTokenizer.from_str(tgt.to_str()).vocab_size == tgt.vocab_size


def test_sentencepiece_source_units_are_sentencepiece_own_segmentation(corpus: CorpusSplits) -> None:
    """The SentencePiece vocabulary's counts make the unigram segmenter return SentencePiece's Viterbi
    pieces (on text it never trained on), and dictionary characters keep every Han character off <unk>."""
    from glassformer.training.prepare_data import han_runs, sentencepiece_tokenizer, train_sentencepiece

    texts = [p.zh for p in corpus.train[:1500]]
    processor = train_sentencepiece(han_runs(texts), 1600)
    tokenizer = sentencepiece_tokenizer(texts, 1600, extra_words=["龘"])
    held_out = han_runs([p.zh for p in corpus.test])
    assert len(held_out) > 200
    differ = [run for run in held_out
              if tokenizer.segment(run) != [p for p in processor.encode(run, out_type=str) if p != "\u2581"]
              and not set(run) - set("".join(tokenizer.vocab.tokens))]        # only runs of known characters
    assert not differ, differ[:5]
    assert len({len(u) for run in held_out for u in tokenizer.segment(run)}) > 1   # pieces, not characters
    assert tokenizer.analyse("龘我").unknown == []


def test_exported_source_tokenizer_keeps_runs_of_latin_letters_and_digits_whole() -> None:
    """A run of other characters is one unit or one <unk> in glassformer; the exported Unigram must not cut it
    into the known pieces it holds (M, 4, 0000, １): without the run marks it gave M + <unk> for Muiriel."""
    from tokenizers import Tokenizer

    from glassformer.interop import segmenter

    units = [["我", "有", "TOEFL", "考试", "。"], ["M", "是", "我", "的", "朋友", "。"], ["4", "0000", "元"],
             ["１", "个", "人"], ["Tom", "和", "Mary"]]
    source = SourceTokenizer.train(units)
    tokenizer = Tokenizer.from_str(segmenter.source_tokenizer(source).to_str())
    texts = ["Muiriel是我的朋友。", "我有TOEFL考试。", "40000元", "４００００元", "１个人", "M是我的朋友。",
             "Tom和Mary和Tomas", "TOEFL/考试", "我有 TOEFL 考试"]
    assert segmenter.differences(source, texts, tokenizer) == []
    muiriel = tokenizer.encode("Muiriel是我的朋友。")
    assert muiriel.ids[0] == UNK and len(muiriel.ids) == len(source.encode("Muiriel是我的朋友。")) == 6
    spelled = dict(zip(source.vocab.tokens, segmenter.spellings(source), strict=True))
    assert spelled["TOEFL"] == f"{segmenter.MARK}TOEFL{segmenter.MARK}" and spelled["我"] == "我"
    assert spelled["。"] == "。" and spelled["<unk>"] == "<unk>"
    assert tokenizer.decode(tokenizer.encode("我有TOEFL考试。").ids) .replace(" ", "") == "我有TOEFL考试。"
