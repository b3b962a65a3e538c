"""Tokenizers for the translator: Chinese source units and English sub-words.

Source side: the model is trained on word units, so whatever a user types must be cut into the same
units. ``SourceTokenizer`` splits exactly at separators the user typed (／, / or spaces); raw text is
segmented over the training vocabulary (default: most-probable path, see docs/data.md for the
measurements behind that choice). Target side: ``TargetTokenizer`` is a BPE from `tokenizers` with a
Metaspace pre-tokenizer/decoder, so decoded ids read as normal English.

Both sides share the special ids PAD=0, BOS=1, EOS=2, UNK=3 and serialise to JSON-able dicts.
"""

from __future__ import annotations

import functools
import math
import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<s>", "</s>", "<unk>")

# User-typed unit separators: full-width slash, ASCII slash, any whitespace (incl. U+3000).
_SEPARATORS = re.compile(r"[／/\s]+")
# ASCII sentence punctuation mapped to the full-width forms the corpus uses (only for these marks).
_ASCII_TO_FULLWIDTH = {",": "，", "!": "！", "?": "？", ";": "；", ":": "：", "(": "（", ")": "）"}
_FULLWIDTH = str.maketrans(_ASCII_TO_FULLWIDTH)


# --------------------------------------------------------------------------- character classes
def is_punct(ch: str) -> bool:
    """Punctuation or symbol (Chinese or ASCII, also emoji): always a unit of its own."""
    return unicodedata.category(ch)[0] in "PS"


def is_han(ch: str) -> bool:
    """A CJK ideograph: the characters the word segmenter works on."""
    code = ord(ch)
    return (0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF or 0xF900 <= code <= 0xFAFF
            or 0x20000 <= code <= 0x323AF)


def normalize_punct(text: str) -> str:
    """Map ASCII , ! ? ; : ( ) to full-width, and '.' after a Han character to '。' (the corpus forms)."""
    if "." in text:
        text = "".join("。" if ch == "." and i > 0 and is_han(text[i - 1]) else ch for i, ch in enumerate(text))
    return text.translate(_FULLWIDTH)


def _is_dropped(ch: str) -> bool:
    """Control/format characters (zero-width joiner) and emoji variation selectors carry no unit."""
    return unicodedata.category(ch) in ("Cc", "Cf") or "\ufe00" <= ch <= "\ufe0f"


@functools.lru_cache(maxsize=1 << 16)
def _kind(ch: str) -> str:
    """A character's class in `split_runs`: "gap" (dropped or space), "punct", "han" or "other" (looked up once)."""
    return "gap" if _is_dropped(ch) or ch.isspace() else "punct" if is_punct(ch) else "han" if is_han(ch) else "other"


def split_runs(text: str) -> list[tuple[str, bool]]:
    """Cut text into (run, is_han_run): each punctuation/symbol alone, Han runs, other runs (Latin, digits).

    Only Han runs are handed to the word segmenter; all other runs are single units.
    """
    runs: list[tuple[str, bool]] = []
    kind_prev, buf = "", ""
    for ch in text:
        kind = _kind(ch)
        if kind != kind_prev or kind == "punct":
            if buf:
                runs.append((buf, kind_prev == "han"))
            buf = ""
        if kind != "gap":
            buf += ch
        kind_prev = kind
    if buf:
        runs.append((buf, kind_prev == "han"))
    return runs


# --------------------------------------------------------------------------- segmenters over a vocabulary
def log_probs(counts: dict[str, int]) -> tuple[dict[str, float], float]:
    """Word log-probabilities (training frequency / total) and the below-any-word score of an unknown character."""
    total = sum(counts.values()) or 1
    return {w: math.log(c / total) for w, c in counts.items()}, math.log(0.5 / total)


def word_ends(words: Iterable[str]) -> set[str]:
    """Every ending of every word ("昨天": "昨天", "天"): past a piece that is none, no longer piece ends a word."""
    return {w[i:] for w in words for i in range(len(w))}


def segment_unigram(run: str, counts: dict[str, int], max_len: int,
                    scores: tuple[dict[str, float], float] | None = None, ends: set[str] | None = None) -> list[str]:
    """Most probable split of ``run`` into known words (word probability = training frequency).

    This is jieba's algorithm restricted to the training vocabulary, done as dynamic programming.
    A character covered by no known word becomes a single-character unit with a below-any-word score.
    Of equally probable splits the one whose last word is longest wins (at every end position), as in the
    `tokenizers` library's Unigram Viterbi, so an exported source_tokenizer.json cuts the same way.
    ``scores`` is ``log_probs(counts)`` and ``ends`` is ``word_ends(counts)``, passed in when many runs are cut
    over the same counts; the words ending at a position are tried shortest first, until a piece ends no word.
    """
    logps, unknown_logp = scores or log_probs(counts)
    ends = word_ends(counts) if ends is None else ends
    best = [0.0] + [-math.inf] * len(run)           # the best score of the run's first `end` characters
    last = [0] + [1] * len(run)                     # the length of its last word
    for end in range(1, len(run) + 1):
        for length in range(1, min(max_len, end) + 1):
            word = run[end - length:end]
            logp = logps.get(word, unknown_logp if length == 1 else None)     # an unknown character: a unit
            if logp is not None and (score := best[end - length] + logp) >= best[end]:   # ties: the longer word
                best[end], last[end] = score, length
            if word not in ends:                                          # no longer word ends here either
                break
    units: list[str] = []
    end = len(run)
    while end > 0:
        units.append(run[end - last[end]:end])
        end -= last[end]
    return units[::-1]


def segment_fmm(run: str, words: set[str] | dict[str, int], max_len: int) -> list[str]:
    """Forward maximum matching: repeatedly take the longest known word at the start (else one character)."""
    units, i = [], 0
    while i < len(run):
        length = next((n for n in range(min(max_len, len(run) - i), 1, -1) if run[i:i + n] in words), 1)
        units.append(run[i:i + length])
        i += length
    return units


def segment_bmm(run: str, words: set[str] | dict[str, int], max_len: int) -> list[str]:
    """Backward maximum matching: longest known word ending at the end of the run, right to left."""
    units, end = [], len(run)
    while end > 0:
        length = next((n for n in range(min(max_len, end), 1, -1) if run[end - n:end] in words), 1)
        units.append(run[end - length:end])
        end -= length
    return units[::-1]


# --------------------------------------------------------------------------- vocabulary
class Vocab:
    """Token <-> id table with the shared specials (PAD=0, BOS=1, EOS=2, UNK=3) and training counts."""

    def __init__(self, tokens: Iterable[str], counts: dict[str, int] | None = None):
        self._itos: list[str] = list(SPECIAL_TOKENS)
        self._stoi = {token: i for i, token in enumerate(self._itos)}
        for token in tokens:
            if token not in self._stoi:
                self._stoi[token] = len(self._itos)
                self._itos.append(token)
        self.counts: dict[str, int] = {t: c for t, c in (counts or {}).items() if t in self._stoi}

    @classmethod
    def build(cls, sequences: Iterable[Iterable[str]], min_freq: int = 1) -> Vocab:
        """Vocabulary of the tokens seen at least ``min_freq`` times; ordered by frequency, then text."""
        counts = Counter(token for seq in sequences for token in seq)
        kept = sorted((t for t, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t))
        return cls(kept, {t: counts[t] for t in kept})

    def __len__(self) -> int:
        return len(self._itos)

    def __contains__(self, token: object) -> bool:
        return token in self._stoi and token not in SPECIAL_TOKENS

    @property
    def tokens(self) -> list[str]:
        """All tokens in id order, specials first."""
        return list(self._itos)

    def token_to_id(self, token: str) -> int:
        """Id of ``token``; UNK (3) if it is not in the vocabulary."""
        return self._stoi.get(token, UNK)

    def id_to_token(self, index: int) -> str:
        """Token text for ``index``; raises IndexError if out of range."""
        return self._itos[index]

    def encode(self, units: Sequence[str]) -> list[int]:
        """Ids of the units; unknown units become UNK."""
        return [self.token_to_id(u) for u in units]

    def decode(self, ids: Sequence[int], strip_special: bool = True) -> list[str]:
        """Units of the ids, optionally without PAD/BOS/EOS (UNK stays visible as '<unk>')."""
        return [self._itos[i] for i in ids if not (strip_special and i in (PAD, BOS, EOS))]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: tokens in id order (specials included) and training counts."""
        return {"tokens": list(self._itos), "counts": dict(self.counts)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Vocab:
        """Inverse of ``to_dict``; checks the special tokens sit at their fixed ids."""
        tokens = list(data["tokens"])
        if tuple(tokens[:len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ValueError(f"vocabulary must start with {SPECIAL_TOKENS}, got {tokens[:4]}")
        return cls(tokens[len(SPECIAL_TOKENS):], data.get("counts") or {})


# --------------------------------------------------------------------------- source tokenizer
@dataclass
class SourceEncoding:
    """Units a text was cut into, their ids, and the units that fell back to UNK (for --verbose)."""

    units: list[str]
    ids: list[int]
    unknown: list[str]
    presegmented: bool  # True if the user's own separators decided the units


class SourceTokenizer:
    """Chinese text -> units -> ids; user-typed separators win, raw text is segmented over the vocabulary.

    Modes: "unigram" (default; most probable split by training frequency), "fmm"/"bmm" (forward /
    backward maximum matching) and "char" (one unit per Han character).
    """

    MODES: tuple[str, ...] = ("unigram", "fmm", "bmm", "char")
    DEFAULT_MODE = "unigram"

    def __init__(self, vocab: Vocab, mode: str = DEFAULT_MODE):
        if mode not in self.MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {self.MODES}")
        self.vocab, self.mode = vocab, mode
        # Only Han words take part in segmentation; punctuation is split off before.
        self._words = {w: self.vocab.counts.get(w, 1) for w in vocab.tokens[len(SPECIAL_TOKENS):]
                       if all(is_han(ch) for ch in w)}
        self._max_len = max(map(len, self._words), default=1)
        self._scores, self._ends = log_probs(self._words), word_ends(self._words)

    @classmethod
    def train(cls, unit_sequences: Iterable[Sequence[str]], mode: str = DEFAULT_MODE,
              min_freq: int = 1) -> SourceTokenizer:
        """Build from the training split's segmented sentences (``Pair.zh_units``): they are the dictionary.

        In "char" mode the units are re-cut into characters first. Never pass dev/test sentences here.
        """
        sequences = [list(units) for units in unit_sequences]
        if mode == "char":
            char_cutter = cls(Vocab([]), "char")
            sequences = [char_cutter.segment("".join(units)) for units in sequences]
        return cls(Vocab.build(sequences, min_freq=min_freq), mode)

    # ---- segmentation
    def _segment_han(self, run: str) -> list[str]:
        if self.mode == "char":
            return list(run)
        if self.mode == "fmm":
            return segment_fmm(run, self._words, self._max_len)
        if self.mode == "bmm":
            return segment_bmm(run, self._words, self._max_len)
        return segment_unigram(run, self._words, self._max_len, self._scores, self._ends)

    @property
    def word_counts(self) -> dict[str, int]:
        """The Han words the segmenter splits over, with their training counts."""
        return dict(self._words)

    @staticmethod
    def is_presegmented(text: str) -> bool:
        """True if the (stripped) text contains a separator: ／, / or whitespace."""
        return _SEPARATORS.search(text.strip()) is not None

    def segment(self, text: str) -> list[str]:
        """Units of ``text``: typed separators (／, /, spaces) are always unit boundaries; a typed piece that is
        not a known unit, and raw text, are segmented over the vocabulary.

        Punctuation and symbols are always units of their own, in both cases.
        """
        text = normalize_punct(text.strip())
        typed = _SEPARATORS.search(text) is not None
        units: list[str] = []
        for piece in _SEPARATORS.split(text) if typed else [text]:
            for run, han in split_runs(piece):
                # a typed piece stays whole when it is a known unit; else it is segmented like raw text
                units.extend(self._segment_han(run) if han and not (typed and run in self.vocab) else [run])
        return units

    # ---- ids
    def analyse(self, text: str, add_bos_eos: bool = False) -> SourceEncoding:
        """Segment and encode ``text``, recording which units are unknown (mapped to UNK)."""
        units = self.segment(text)
        ids = self.vocab.encode(units)
        unknown = [u for u, i in zip(units, ids, strict=True) if i == UNK]
        if add_bos_eos:
            ids = [BOS, *ids, EOS]
        return SourceEncoding(units, ids, unknown, self.is_presegmented(text))

    def encode(self, text: str, add_bos_eos: bool = False) -> list[int]:
        """Ids of ``text`` (unknown units -> UNK); optionally wrapped in BOS ... EOS."""
        return self.analyse(text, add_bos_eos).ids

    def unknown_units(self, text: str) -> list[str]:
        """Units of ``text`` that are not in the training vocabulary (they encode as UNK)."""
        return self.analyse(text).unknown

    def decode(self, ids: Sequence[int]) -> list[str]:
        """Units for ids, without PAD/BOS/EOS."""
        return self.vocab.decode(ids)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    # ---- serialisation
    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (mode + vocabulary with counts); restores without the corpus package."""
        return {"type": "SourceTokenizer", "version": 1, "mode": self.mode, "vocab": self.vocab.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SourceTokenizer:
        """Inverse of ``to_dict``."""
        if data.get("type") != "SourceTokenizer":
            raise ValueError(f"not a SourceTokenizer dict: type={data.get('type')!r}")
        return cls(Vocab.from_dict(data["vocab"]), data["mode"])


# --------------------------------------------------------------------------- target tokenizer
class TargetTokenizer:
    """English sub-words: BPE trained on the train-split English, Metaspace (▁) so decoding restores spaces.

    Punctuation is split off words before BPE ("yesterday." -> "▁yesterday" "."), and every printable
    ASCII character is in the alphabet, so only unseen non-ASCII characters can become UNK.
    """

    DEFAULT_VOCAB_SIZE = 2000

    def __init__(self, tokenizer: Tokenizer):
        for index, token in enumerate(SPECIAL_TOKENS):
            if tokenizer.token_to_id(token) != index:
                raise ValueError(f"special token {token!r} must have id {index}")
        self.tokenizer = tokenizer

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> TargetTokenizer:
        """Train a BPE of at most ``vocab_size`` entries (specials and alphabet included) on ``texts``."""
        tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS[UNK]))
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation(behavior="isolated")])
        tokenizer.decoder = decoders.Metaspace()
        alphabet = [ch for ch in string.printable if not ch.isspace()] + ["▁"]
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                      initial_alphabet=alphabet, show_progress=False)
        tokenizer.train_from_iterator(list(texts), trainer=trainer)
        return cls(tokenizer)

    def encode(self, text: str, add_bos_eos: bool = False) -> list[int]:
        """Sub-word ids of ``text``; optionally wrapped in BOS ... EOS."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return [BOS, *ids, EOS] if add_bos_eos else ids

    def tokens(self, text: str) -> list[str]:
        """Sub-word strings of ``text`` (e.g. ['▁I', '▁gave', ..., '.'])."""
        return self.tokenizer.encode(text, add_special_tokens=False).tokens

    def decode(self, ids: Sequence[int]) -> str:
        """English text: stops at the first EOS, drops specials (PAD/BOS/UNK), restores spaces."""
        ids = list(ids)
        if EOS in ids:
            ids = ids[:ids.index(EOS)]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def id_to_token(self, index: int) -> str | None:
        return self.tokenizer.id_to_token(index)

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def to_str(self) -> str:
        """The `tokenizers` JSON string (model, merges, pre-tokenizer, decoder)."""
        return self.tokenizer.to_str()

    @classmethod
    def from_str(cls, data: str) -> TargetTokenizer:
        return cls(Tokenizer.from_str(data))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form wrapping ``to_str``."""
        return {"type": "TargetTokenizer", "version": 1, "tokenizer": self.to_str()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TargetTokenizer:
        if data.get("type") != "TargetTokenizer":
            raise ValueError(f"not a TargetTokenizer dict: type={data.get('type')!r}")
        return cls.from_str(data["tokenizer"])
