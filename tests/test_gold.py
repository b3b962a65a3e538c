"""The hand-aligned gold set and its scorer: the packaged file against the corpus, AER on cases worked out
by hand, hostile gold files, and the projection of a model's units onto gold tokens."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from glassformer.errors import UsageError
from glassformer.interpret import gold as G
from glassformer.interpret.gold import (
    GoldPair,
    format_links,
    gold_statistics,
    load_gold,
    parse_links,
    project_links,
    project_units,
    score,
    select_pairs,
    source_tokens,
    target_tokens,
)

DOC = Path(__file__).resolve().parents[1] / "docs" / "alignment.md"


# ---- the packaged set ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def packaged() -> list[GoldPair]:
    return load_gold()


@pytest.fixture(scope="module")
def splits() -> dict[str, list]:
    from glassformer.data.datasets import load_split

    return {name: load_split(name) for name in ("test", "tatoeba")}


def test_packaged_set_sizes_and_links(packaged):
    assert len(packaged) >= 120
    by_split = gold_statistics(packaged)["splits"]
    assert by_split["test"] >= 60 and by_split["tatoeba"] >= 60, by_split
    for pair in packaged:
        assert list(pair.src) == source_tokens(pair.zh) and list(pair.tgt) == target_tokens(pair.en), pair.id
        assert pair.sure <= pair.possible, pair.id
        assert pair.sure, pair.id                                   # every pair was aligned
        assert all(i < len(pair.src) and j < len(pair.tgt) for i, j in pair.possible), pair.id


def test_packaged_pairs_are_the_corpus_pairs_chosen_by_the_rule(packaged, splits):
    for name, pairs in splits.items():
        by_id = {p.id: p for p in pairs}
        mine = [p for p in packaged if p.split == name]
        for pair in mine:
            assert pair.id in by_id, pair.id
            assert (pair.zh, pair.en) == (by_id[pair.id].zh, by_id[pair.id].en), pair.id   # reference untouched
        assert [p.id for p in mine] == [p.id for p in select_pairs(pairs, len(mine))], name


def test_no_packaged_pair_is_training_data(packaged):
    from glassformer.data.corpus import load_corpus
    from glassformer.data.datasets import load_tatoeba_splits
    from glassformer.data.sources import match_key

    train = [*load_corpus().train, *load_tatoeba_splits().train]
    train_ids = {p.id for p in train}
    train_keys = {match_key(p.zh) for p in train}
    for pair in packaged:
        assert pair.id not in train_ids and match_key(pair.zh) not in train_keys, pair.id


def test_doc_counts_match_the_file(packaged):
    stats = gold_statistics(packaged)
    text = DOC.read_text(encoding="utf-8")
    rows = {
        "pairs": stats["pairs"], "pairs from HSK test": stats["splits"]["test"],
        "pairs from Tatoeba held-out": stats["splits"]["tatoeba"], "source tokens": stats["source_tokens"],
        "target tokens": stats["target_tokens"], "sure links": stats["sure_links"],
        "possible links (sure included)": stats["possible_links"],
        "possible-only links": stats["possible_only_links"],
        "unaligned source tokens": stats["unaligned_source_tokens"],
        "unaligned target tokens": stats["unaligned_target_tokens"],
    }
    for label, value in rows.items():
        assert f"| {label} | {value:,} |" in text, label
    assert stats["possible_links"] == stats["sure_links"] + stats["possible_only_links"]
    assert "## Results on the default model" in text and "`glassformer align --gold --heads" in text


def test_importing_the_scorer_needs_no_torch():
    code = "import sys, glassformer.interpret.gold; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- tokens and links ------------------------------------------------------------------------
def test_tokenizers():
    assert source_tokens("我用 iPhone看了2010年的 照片。") == [
        "我", "用", "iPhone", "看", "了", "2010", "年", "的", "照", "片", "。"]
    assert source_tokens("６月１８号") == ["６", "月", "１", "８", "号"]
    assert target_tokens("Tom's here, isn't he? It’s well-known.") == [
        "Tom's", "here", ",", "isn't", "he", "?", "It’s", "well", "-", "known", "."]


def test_links_round_trip():
    assert parse_links("") == frozenset()
    assert parse_links(" 1-3  0-0\t2-3 1-3") == {(0, 0), (1, 3), (2, 3)}
    assert format_links({(2, 3), (0, 0), (1, 3)}) == "0-0 1-3 2-3"
    for bad in ("1-", "a-b", "-1-2", "1:2", "1-2-3", "+1-2"):
        with pytest.raises(UsageError, match="malformed link"):
            parse_links(f"0-0 {bad}")


# ---- scoring, worked by hand -----------------------------------------------------------------
def _pair(sure: str, possible: str, n: int = 3) -> GoldPair:
    sure_links = parse_links(sure)
    return GoldPair("x", "test", "", "", ("a",) * n, ("b",) * n, sure_links, sure_links | parse_links(possible))


def test_perfect_and_disjoint_predictions():
    gold = [_pair("0-0 1-1", "")]
    perfect = score([{(0, 0), (1, 1)}], gold)
    assert (perfect.aer, perfect.precision, perfect.recall) == (0.0, 1.0, 1.0)
    wrong = score([{(0, 1), (2, 2)}], gold)
    assert (wrong.aer, wrong.precision, wrong.recall) == (1.0, 0.0, 0.0)        # 1 − 0 / (2 + 2)


def test_mixed_case():
    # S = {0-0, 1-1}, P = S ∪ {1-2, 2-2}; A = {0-0, 1-2, 2-0}:
    # |A∩S| = 1, |A∩P| = 2, |A| = 3, |S| = 2 -> AER = 1 − 3/5 = 0.4, precision 2/3, recall 1/2.
    s = score([{(0, 0), (1, 2), (2, 0)}], [_pair("0-0 1-1", "1-2 2-2")])
    assert s.aer == pytest.approx(0.4) and s.precision == pytest.approx(2 / 3) and s.recall == pytest.approx(0.5)
    assert (s.predicted, s.sure, s.possible, s.sure_hits, s.possible_hits) == (3, 2, 4, 1, 2)
    # A predicted possible link lowers AER without adding recall: A = S ∪ {1-2} -> 1 − (2 + 3)/(3 + 2) = 0.
    assert score([{(0, 0), (1, 1), (1, 2)}], [_pair("0-0 1-1", "1-2 2-2")]).aer == pytest.approx(0.0)


def test_scores_are_summed_over_the_corpus_not_averaged():
    # sentence 1 as in test_mixed_case; sentence 2: S = P = {0-0}, A = {} ->
    # |A| = 3, |S| = 3, |A∩S| = 1, |A∩P| = 2: AER = 1 − 3/6 = 0.5 (a mean per sentence would be (0.4 + 1)/2 = 0.7).
    s = score([{(0, 0), (1, 2), (2, 0)}, set()], [_pair("0-0 1-1", "1-2 2-2"), _pair("0-0", "")])
    assert s.aer == pytest.approx(0.5) and s.precision == pytest.approx(2 / 3) and s.recall == pytest.approx(1 / 3)


def test_empty_cases():
    none = score([set()], [_pair("0-0", "1-1")])
    assert (none.aer, none.precision, none.recall, none.predicted) == (1.0, 0.0, 0.0, 0)
    nothing = score([set()], [_pair("", "")])
    assert (nothing.aer, nothing.precision, nothing.recall) == (0.0, 0.0, 0.0)
    only_possible = score([{(1, 1)}], [_pair("", "1-1")])             # |S| = 0: recall 0.0, AER 1 − 1/1
    assert (only_possible.aer, only_possible.precision, only_possible.recall) == (0.0, 1.0, 0.0)
    assert score([], []).aer == 0.0
    with pytest.raises(ValueError, match="2 predicted link sets for 1 gold pairs"):
        score([set(), set()], [_pair("0-0", "")])


def test_gold_scores_itself_perfectly(packaged):
    assert score([set(p.sure) for p in packaged], packaged).aer == 0.0
    assert score([set(p.possible) for p in packaged], packaged).precision == 1.0


# ---- hostile files ---------------------------------------------------------------------------
GOOD = {"id": "x1", "split": "test", "zh": "我很好。", "en": "I am fine.", "src": ["我", "很", "好", "。"],
        "tgt": ["I", "am", "fine", "."], "sure": "0-0 2-2 3-3", "possible": "0-0 1-1 2-2 3-3"}


def _changed(**fields) -> str:
    record = {**GOOD, "id": "x2", **fields}
    return json.dumps({k: v for k, v in record.items() if v is not None}, ensure_ascii=False)


def _write(tmp_path: Path, *lines: str | bytes) -> Path:
    path = tmp_path / "gold.jsonl"
    path.write_bytes(b"\n".join(x if isinstance(x, bytes) else x.encode("utf-8") for x in lines) + b"\n")
    return path


HOSTILE = [
    ("{oops", None, "not JSON"),
    (b'{"id": "\xff\xfe"}', None, "not UTF-8"),
    ("[1, 2]", None, "not a JSON object"),
    (_changed(sure=None), "sure", "missing"),
    (_changed(extra=1), "extra", "unknown field"),
    (_changed(zh=5), "zh", "expected a string"),
    (_changed(id=" "), "id", "empty"),
    (_changed(split="train"), "split", "'train' is not one of"),
    (_changed(src="我很好。"), "src", "list of strings"),
    (_changed(src=["我很", "好", "。"]), "src", "differ from the tokenized 'zh' at index 0"),
    (_changed(tgt=["i", "am", "fine", "."]), "tgt", "differ from the tokenized 'en' at index 0"),
    (_changed(sure="0-0 9-2", possible="0-0 9-2"), "sure", "link 9-2 is out of range"),
    (_changed(possible="0-0 1-1 2-2 3-4"), "possible", "link 3-4 is out of range"),
    (_changed(possible="0-0 1_1 2-2 3-3"), "possible", "malformed link '1_1'"),
    (_changed(sure="0-0 1-2", possible="0-0 1-1"), "possible", "sure link 1-2 is not possible"),
    (json.dumps({**GOOD}, ensure_ascii=False), "id", "'x1' repeats line 1"),
]


@pytest.mark.parametrize(("line", "field", "why"), HOSTILE, ids=[h[2] for h in HOSTILE])
def test_hostile_line_names_line_and_field(tmp_path, line, field, why):
    path = _write(tmp_path, json.dumps(GOOD, ensure_ascii=False), line)
    with pytest.raises(UsageError) as info:
        load_gold(path)
    message = str(info.value)
    assert "\n" not in message and f"{path} line 2: " in message and why in message, message
    if field is not None:
        assert f"field {field!r}" in message and info.value.field == field, message


def test_good_file_loads_and_blank_lines_are_skipped(tmp_path):
    path = _write(tmp_path, json.dumps(GOOD, ensure_ascii=False), "", "  ", _changed())
    pairs = load_gold(path)
    assert [p.id for p in pairs] == ["x1", "x2"] and pairs[0].sure == {(0, 0), (2, 2), (3, 3)}
    assert load_gold(_write(tmp_path, *(p.to_json() for p in pairs))) == pairs          # to_json round-trips


def test_oversized_file_is_refused_before_reading(tmp_path, monkeypatch):
    path = _write(tmp_path, json.dumps(GOOD, ensure_ascii=False))
    monkeypatch.setattr(G, "MAX_GOLD_BYTES", 10)

    def no_reading(*args, **kwargs):
        raise AssertionError("the file was opened")

    monkeypatch.setattr(pathlib.Path, "open", no_reading)
    with pytest.raises(UsageError, match=r"over MAX_GOLD_BYTES \(10\)") as info:
        load_gold(path)
    assert info.value.status == 413


def test_too_many_pairs_and_tokens(tmp_path, monkeypatch):
    path = _write(tmp_path, json.dumps(GOOD, ensure_ascii=False), _changed())
    monkeypatch.setattr(G, "MAX_GOLD_PAIRS", 1)
    with pytest.raises(UsageError, match=r"line 2: more than MAX_GOLD_PAIRS \(1\)"):
        load_gold(path)
    monkeypatch.setattr(G, "MAX_GOLD_PAIRS", 10)
    monkeypatch.setattr(G, "MAX_GOLD_TOKENS", 3)
    with pytest.raises(UsageError, match=r"line 1: field 'src': 4 tokens is over MAX_GOLD_TOKENS \(3\)"):
        load_gold(path)


def test_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="cannot read the gold file"):
        load_gold(tmp_path / "absent.jsonl")


# ---- projection ------------------------------------------------------------------------------
def test_segmenter_words_merge_characters():
    zh = "我昨天给他打电话。"
    units = ["我", "昨天", "给", "他", "打电话", "。"]
    assert project_units(zh, units, source_tokens(zh)) == [[0], [1, 2], [3], [4], [5, 6, 7], [8]]


def test_pieces_split_a_token_and_case_is_ignored():
    en = "Yesterday I didn't go."
    units = ["YESTER", "day", "i", "did", "n't", "go", "."]
    assert project_units(en, units, target_tokens(en)) == [[0], [0], [1], [2], [2], [3], [4]]
    # a unit across a token boundary covers both tokens
    assert project_units("Python脚本", ["python脚", "本"], source_tokens("Python脚本")) == [[0, 1], [2]]


def test_units_not_in_the_text():
    assert project_units("我很好", ["我", "qq", "很好", "xyz"], source_tokens("我很好")) == [[0], [], [1, 2], []]
    zh = "今天是Muiriel的生日！"
    units = ["今天", "是", "<unk>", "的", "生日", "！"]           # a placeholder stands in for the name
    assert project_units(zh, units, source_tokens(zh)) == [[0, 1], [2], [3], [4], [5, 6], [7]]


def test_normalised_units():
    zh = "今天是６月１８号"
    assert project_units(zh, ["今天", "是", "6", "月", "18", "号"], source_tokens(zh)) == [
        [0, 1], [2], [3], [4], [5, 6], [7]]
    assert project_units("Tom’s here", ["▁Tom's", "▁here"], target_tokens("Tom’s here")) == [[0], [1]]


def test_tokens_must_spell_the_text():
    with pytest.raises(UsageError, match="do not spell the text"):
        project_units("我很好", ["我"], ["我", "好"])


def test_project_links():
    src_map, tgt_map = [[0], [1, 2], []], [[0], [1], [1, 2]]
    assert project_links({(1, 2), (0, 0), (2, 1)}, src_map, tgt_map) == {(1, 1), (1, 2), (2, 1), (2, 2), (0, 0)}
    with pytest.raises(UsageError, match=re.escape("unit link 3-0 is out of range")):
        project_links({(3, 0)}, src_map, tgt_map)


def test_select_pairs_rule():
    from glassformer.data.corpus import Pair

    pairs = [Pair(f"p{k}", "我很好。" if k % 3 else "好。", "I am fine.", []) for k in range(12)]
    chosen = select_pairs(pairs, 3)
    assert len(chosen) == 3 and all(len(source_tokens(p.zh)) >= 4 for p in chosen)
    assert chosen == select_pairs(list(reversed(pairs)), 3)                     # order of the input is irrelevant
    assert select_pairs(pairs, 100) == select_pairs(pairs, 8)                 # 8 pairs pass the length rule
