"""Gold word alignments (Chinese source ↔ English reference) and the alignment error rate (AER).

The packaged set, ``glassformer/data/alignment_gold.jsonl``, holds one JSON object per line:

    {"id": "hsk1-0054", "split": "test", "zh": "...", "en": "...", "src": [tokens], "tgt": [tokens],
     "sure": "0-0 1-3 ...", "possible": "0-0 1-3 2-3 ..."}

Links are Pharaoh pairs "i-j" (i a source-token index, j a target-token index, both 0-based), and every
sure link is also possible (S ⊆ P). The tokens are re-derivable from the text: ``source_tokens(zh)`` (one
token per character, a run of ASCII letters/digits as one) and ``target_tokens(en)`` (words with
punctuation split off). docs/alignment.md describes how the set was made.

Scoring (Och & Ney 2003), summed over the corpus (micro), with A the predicted links:

    precision = |A ∩ P| / |A|      recall = |A ∩ S| / |S|      AER = 1 − (|A ∩ S| + |A ∩ P|) / (|A| + |S|)

A model aligns its own units (segmenter words, decoded words); ``project_units`` maps each unit to the gold
tokens it covers, and ``project_links`` expands unit–unit links to gold token links.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from ..errors import UsageError

MAX_GOLD_BYTES = 8 << 20        # a gold file (8 MiB), checked before it is read
MAX_GOLD_PAIRS = 10_000         # sentence pairs in one gold file
MAX_GOLD_TOKENS = 512           # tokens of one side of one pair

SPLITS = ("dev", "test", "tatoeba", "everyday")     # the evaluation splits a gold pair may come from
FIELDS = ("id", "split", "zh", "en", "src", "tgt", "sure", "possible")

# The selection rule of the packaged set (select_pairs): length bounds, inclusive, in gold tokens.
SELECT_SOURCE_TOKENS = (4, 30)
SELECT_TARGET_TOKENS = (2, 25)

_SOURCE_TOKEN = re.compile(r"[A-Za-z0-9]+|\S")
_TARGET_TOKEN = re.compile(r"[A-Za-z0-9]+(?:['’][A-Za-z]+)*|[^\sA-Za-z0-9]")
_LINK = re.compile(r"([0-9]+)-([0-9]+)")

Link = tuple[int, int]


# ---- tokens -----------------------------------------------------------------------------------
def source_tokens(zh: str) -> list[str]:
    """Gold source tokens: every non-space character, except that a run of ASCII letters/digits is one token.

    "我用iPhone 2010" -> ["我", "用", "iPhone", "2010"]. Full-width digits ("１８") stay one token each.
    """
    return _SOURCE_TOKEN.findall(zh)


def target_tokens(en: str) -> list[str]:
    """Gold target tokens: words (with an apostrophe suffix: "don't", "Tom's") and single punctuation marks.

    "Tom's here, isn't he?" -> ["Tom's", "here", ",", "isn't", "he", "?"]; "well-known" -> ["well", "-", "known"].
    """
    return _TARGET_TOKEN.findall(en)


# ---- links ------------------------------------------------------------------------------------
def parse_links(text: str) -> frozenset[Link]:
    """Pharaoh links "0-0 1-3 2-3" -> frozenset({(0, 0), (1, 3), (2, 3)}); "" -> frozenset().

    Raises UsageError naming the first link that is not two non-negative integers joined by "-", or whose
    index has more digits than any index below MAX_GOLD_TOKENS (checked before the digits are converted:
    `int` refuses strings of over 4300 digits, and no such index is ever in range).
    """
    digits = len(str(MAX_GOLD_TOKENS))
    links = set()
    for item in text.split():
        match = _LINK.fullmatch(item)
        if match is None:
            raise UsageError(f"malformed link {item[:40]!r} (expected i-j, two non-negative integers)")
        indices = [group.lstrip("0") or "0" for group in match.groups()]
        longest = max(len(index) for index in indices)
        if longest > digits:
            raise UsageError(f"link {item[:40]!r}: an index of {longest} digits is out of range (a side has at "
                             f"most MAX_GOLD_TOKENS ({MAX_GOLD_TOKENS}) tokens)")
        links.add((int(indices[0]), int(indices[1])))
    return frozenset(links)


def format_links(links: Iterable[Link]) -> str:
    """Links -> Pharaoh text, sorted by source then target index: {(1, 3), (0, 0)} -> "0-0 1-3"."""
    return " ".join(f"{i}-{j}" for i, j in sorted(set(links)))


# ---- the gold set -----------------------------------------------------------------------------
@dataclass(frozen=True)
class GoldPair:
    """One hand-aligned pair: the texts, their gold tokens, and sure ⊆ possible links (i-th src, j-th tgt)."""

    id: str
    split: str
    zh: str
    en: str
    src: tuple[str, ...]
    tgt: tuple[str, ...]
    sure: frozenset[Link]
    possible: frozenset[Link]

    def to_json(self) -> str:
        """The pair as one line of the gold file (no newline)."""
        return json.dumps({"id": self.id, "split": self.split, "zh": self.zh, "en": self.en,
                           "src": list(self.src), "tgt": list(self.tgt), "sure": format_links(self.sure),
                           "possible": format_links(self.possible)}, ensure_ascii=False)


def default_path() -> Any:
    """The packaged gold file (a Traversable: a Path when glassformer is installed from a folder)."""
    return resources.files("glassformer") / "data" / "alignment_gold.jsonl"


def load_gold(path: str | os.PathLike[str] | None = None) -> list[GoldPair]:
    """Read and validate a gold file (default: the packaged set); pairs in file order.

    Every problem is a UsageError whose one-line message names the file, the line and the field: the
    file over MAX_GOLD_BYTES (checked before reading), more than MAX_GOLD_PAIRS pairs, a line that is not
    UTF-8 or not a JSON object, a missing, unknown or mistyped field, tokens that differ from
    source_tokens(zh) / target_tokens(en) or exceed MAX_GOLD_TOKENS, a malformed or out-of-range link,
    sure ⊄ possible, a repeated id, no pair at all. Blank lines are skipped.
    """
    source = default_path() if path is None else Path(path)
    name = str(source)
    size = _file_size(source)
    if size is not None and size > MAX_GOLD_BYTES:
        raise UsageError(f"{name}: {size} bytes is over MAX_GOLD_BYTES ({MAX_GOLD_BYTES})", status=413)
    try:
        with source.open("rb") as handle:
            data = handle.read(MAX_GOLD_BYTES + 1)
    except OSError as error:
        raise UsageError(f"{name}: cannot read the gold file ({error.strerror or error})") from None
    if len(data) > MAX_GOLD_BYTES:
        raise UsageError(f"{name}: over MAX_GOLD_BYTES ({MAX_GOLD_BYTES})", status=413)
    pairs: list[GoldPair] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        if len(pairs) >= MAX_GOLD_PAIRS:
            raise UsageError(f"{name} line {number}: more than MAX_GOLD_PAIRS ({MAX_GOLD_PAIRS}) pairs", status=413)
        pair = _parse_line(raw, f"{name} line {number}")
        if pair.id in seen:
            raise UsageError(f"{name} line {number}: field 'id': {pair.id!r} repeats line {seen[pair.id]}", "id")
        seen[pair.id] = number
        pairs.append(pair)
    if not pairs:                   # nothing to score: an AER over no pairs would read as a perfect 0.000
        raise UsageError(f"{name}: no gold pairs (the file is empty or holds only blank lines)")
    return pairs


def _file_size(source: Any) -> int | None:
    try:
        return os.stat(source).st_size
    except (OSError, TypeError):
        return None         # not a plain file (a Traversable inside an archive): the bounded read still holds


def _parse_line(raw: bytes, where: str) -> GoldPair:
    """One line -> GoldPair, or a UsageError "<where>: field '<f>': <why>"."""
    def fail(field: str | None, why: str) -> UsageError:
        return UsageError(f"{where}: field {field!r}: {why}" if field else f"{where}: {why}", field)

    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise fail(None, "not UTF-8 text") from None
    except (json.JSONDecodeError, RecursionError) as error:
        raise fail(None, f"not JSON ({getattr(error, 'msg', 'too deeply nested')})") from None
    if not isinstance(record, dict):
        raise fail(None, f"not a JSON object (a {type(record).__name__})")
    for field in FIELDS:
        if field not in record:
            raise fail(field, "missing")
    unknown = sorted(set(record) - set(FIELDS))
    if unknown:
        raise fail(unknown[0], f"unknown field (expected only {', '.join(FIELDS)})")
    for field in ("id", "split", "zh", "en", "sure", "possible"):
        if not isinstance(record[field], str):
            raise fail(field, f"expected a string, got {type(record[field]).__name__}")
    if not record["id"].strip():
        raise fail("id", "empty")
    if record["split"] not in SPLITS:
        raise fail("split", f"{record['split'][:40]!r} is not one of {', '.join(SPLITS)}")
    sides = {"src": source_tokens, "tgt": target_tokens}
    for field, text_field in (("src", "zh"), ("tgt", "en")):
        tokens = record[field]
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise fail(field, "expected a list of strings")
        if len(tokens) > MAX_GOLD_TOKENS:
            raise fail(field, f"{len(tokens)} tokens is over MAX_GOLD_TOKENS ({MAX_GOLD_TOKENS})")
        expected = sides[field](record[text_field])
        if tokens != expected:
            pairs = enumerate(zip(tokens, expected, strict=False))
            at = next((k for k, (a, b) in pairs if a != b), min(len(tokens), len(expected)))
            raise fail(field, f"tokens differ from the tokenized '{text_field}' at index {at} "
                              f"({len(tokens)} given, {len(expected)} expected)")
    links = {}
    for field in ("sure", "possible"):
        try:
            links[field] = parse_links(record[field])
        except UsageError as error:
            raise fail(field, str(error)) from None
        for i, j in sorted(links[field]):
            if i >= len(record["src"]) or j >= len(record["tgt"]):
                raise fail(field, f"link {i}-{j} is out of range ({len(record['src'])} source, "
                                  f"{len(record['tgt'])} target tokens)")
    missing = links["sure"] - links["possible"]
    if missing:
        raise fail("possible", f"sure link {format_links(missing).split()[0]} is not possible (sure ⊆ possible)")
    return GoldPair(record["id"], record["split"], record["zh"], record["en"], tuple(record["src"]),
                    tuple(record["tgt"]), links["sure"], links["possible"])


class _PairLike(Protocol):
    id: str
    zh: str
    en: str


def select_pairs(split_pairs: Sequence[_PairLike], n: int) -> list[_PairLike]:
    """The packaged set's selection rule: the first n pairs by md5(pair id) (hex digest, ascending) among
    those with 4–30 source tokens and 2–25 target tokens (SELECT_SOURCE_TOKENS, SELECT_TARGET_TOKENS)."""
    lo_src, hi_src = SELECT_SOURCE_TOKENS
    lo_tgt, hi_tgt = SELECT_TARGET_TOKENS
    kept = [p for p in split_pairs
            if lo_src <= len(source_tokens(p.zh)) <= hi_src and lo_tgt <= len(target_tokens(p.en)) <= hi_tgt]
    kept.sort(key=lambda p: hashlib.md5(p.id.encode("utf-8")).hexdigest())
    return kept[:n]


def gold_statistics(gold: Sequence[GoldPair]) -> dict[str, Any]:
    """Counts for docs/alignment.md: pairs (in all and per split), tokens per side, sure and possible links.

    "possible_links" counts all of P (sure links included); "possible_only_links" counts P \\ S.
    """
    splits: dict[str, int] = {}
    for pair in gold:
        splits[pair.split] = splits.get(pair.split, 0) + 1
    return {
        "pairs": len(gold),
        "splits": splits,
        "source_tokens": sum(len(p.src) for p in gold),
        "target_tokens": sum(len(p.tgt) for p in gold),
        "sure_links": sum(len(p.sure) for p in gold),
        "possible_links": sum(len(p.possible) for p in gold),
        "possible_only_links": sum(len(p.possible - p.sure) for p in gold),
        "unaligned_source_tokens": sum(len(p.src) - len({i for i, _ in p.possible}) for p in gold),
        "unaligned_target_tokens": sum(len(p.tgt) - len({j for _, j in p.possible}) for p in gold),
    }


# ---- scoring ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scores:
    """Corpus-level (micro) alignment scores and the counts behind them.

    predicted = Σ|A|, sure = Σ|S|, possible = Σ|P|, sure_hits = Σ|A ∩ S|, possible_hits = Σ|A ∩ P|.
    A ratio whose denominator is 0 is reported as 0.0 (precision without predictions, recall without sure
    links); AER with no predictions and no sure links is 0.0, with no predictions alone it is 1.0.
    """

    aer: float
    precision: float
    recall: float
    predicted: int
    sure: int
    possible: int
    sure_hits: int
    possible_hits: int


def score(predicted: Sequence[Iterable[Link]], gold: Sequence[GoldPair]) -> Scores:
    """Score predicted links (one set of (source, target) gold-token links per pair, in gold's order)."""
    if len(predicted) != len(gold):
        raise ValueError(f"{len(predicted)} predicted link sets for {len(gold)} gold pairs")
    n_a = n_s = n_p = hit_s = hit_p = 0
    for links, pair in zip(predicted, gold, strict=True):
        a = set(links)
        n_a, n_s, n_p = n_a + len(a), n_s + len(pair.sure), n_p + len(pair.possible)
        hit_s += len(a & pair.sure)
        hit_p += len(a & pair.possible)
    aer = 1.0 - (hit_s + hit_p) / (n_a + n_s) if n_a + n_s else 0.0
    return Scores(aer=aer, precision=hit_p / n_a if n_a else 0.0, recall=hit_s / n_s if n_s else 0.0,
                  predicted=n_a, sure=n_s, possible=n_p, sure_hits=hit_s, possible_hits=hit_p)


# ---- projection from a model's units to gold tokens ------------------------------------------
def _key(ch: str) -> str:
    """One character as compared: NFKC ("６" -> "6") and lower case, when either keeps it one character."""
    for form in (unicodedata.normalize("NFKC", ch).lower(), ch.lower()):
        if len(form) == 1:
            return form
    return ch


def _compact(text: str) -> str:
    """Text with whitespace (and SentencePiece's word marker "▁") removed, each character keyed by _key."""
    return "".join(_key(c) for c in text if not c.isspace() and c != "▁")


def project_units(text: str, units: Sequence[str], tokens: Sequence[str]) -> list[list[int]]:
    """For each unit, the sorted indices of the gold tokens whose characters it covers.

    text: one side's text ("昨天我给他打电话。" or the English reference); tokens: its gold tokens
    (source_tokens / target_tokens of text); units: the model's units of that side, in order (words of
    its segmenter, or words decoded from sub-word pieces). Both are compared with whitespace removed,
    case-insensitively and NFKC-normalised, character by character: difflib.SequenceMatcher aligns the
    units' characters to the text's; equal runs map one to one, a replaced run ("<unk>" against
    "Muiriel") maps proportionally onto the text it replaces, and a unit whose characters are all
    deleted (text has nothing left for it) maps to []. Returns len(units) lists.
    """
    target = _compact(text)
    if _compact("".join(tokens)) != target:
        raise UsageError("gold tokens do not spell the text (whitespace removed)", "tokens")
    token_of = [k for k, token in enumerate(tokens) for _ in _compact(token)]  # text char -> token index
    unit_of = [k for k, unit in enumerate(units) for _ in _compact(unit)]      # unit char -> unit index
    found: list[set[int]] = [set() for _ in units]
    matcher = difflib.SequenceMatcher(None, _compact("".join(units)), target, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            for i, j in zip(range(i1, i2), range(j1, j2), strict=True):
                found[unit_of[i]].add(token_of[j])
        elif op == "replace":
            width, span = i2 - i1, j2 - j1
            for r in range(width):      # unit char r of the run covers text chars [⌊r·span/width⌋, ⌈(r+1)·span/width⌉)
                first, last = j1 + r * span // width, j1 - (-(r + 1) * span // width)
                found[unit_of[i1 + r]].update(token_of[j] for j in range(first, last))
    return [sorted(tokens_of_unit) for tokens_of_unit in found]


def project_links(links_between_units: Iterable[Link], src_map: Sequence[Sequence[int]],
                  tgt_map: Sequence[Sequence[int]]) -> set[Link]:
    """Unit–unit links (source unit u, target unit v) -> gold token links {(i, j): i in src_map[u], j in
    tgt_map[v]}; src_map / tgt_map as project_units returns them."""
    out: set[Link] = set()
    for u, v in links_between_units:
        if not (0 <= u < len(src_map) and 0 <= v < len(tgt_map)):
            raise UsageError(f"unit link {u}-{v} is out of range ({len(src_map)} source, {len(tgt_map)} target units)")
        out.update((i, j) for i in src_map[u] for j in tgt_map[v])
    return out
