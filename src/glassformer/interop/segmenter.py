"""glassformer's source segmenter and target BPE in the `tokenizers` library's format, for exported models.

The target side already is a `tokenizers` BPE: its JSON is written as it is. The source side
(data/tokenize.py: punctuation normalised, cut at typed separators, punctuation and symbols
alone, Han runs segmented by the most probable split over the training word counts) becomes a
`tokenizers` pipeline: normalizers for the punctuation, pre-tokenizers for the cuts, and a Unigram
model whose scores are the same log-probabilities log(count / total).

A run of other characters (Latin letters, digits, full-width digits) is one unit in glassformer, never
cut: the normalizer marks both ends of each such run with MARK (U+E000, a private-use character), and
the vocabulary spells those units between marks (`spellings`), so Unigram can match a unit only as the
whole run; a run that is no unit is all unknown, one `<unk>`, as in glassformer. The exported
CTranslate2 vocabulary uses the same spellings (CTranslate2 is fed token strings).

Where the two can still differ (docs/interop.md): the Unigram model fuses consecutive unknown Han
characters into one `<unk>` (glassformer: one each) and scores an unknown character at (lowest score -
10) where glassformer uses log(0.5 / total); a piece the user typed between separators is cut again by
Unigram even when it is a known unit; a user-typed U+E000 is an ordinary character to glassformer.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from ..data.tokenize import (
    _ASCII_TO_FULLWIDTH,
    SPECIAL_TOKENS,
    UNK,
    SourceTokenizer,
    is_han,
    is_punct,
    log_probs,
    split_runs,
)

# the Han ranges of tokenize.is_han, as a regular-expression class
HAN = r"[\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{F900}-\x{FAFF}\x{20000}-\x{323AF}]"
OTHER_SCORE = -1.0        # a non-Han unit (it can only match a whole run)
MARK = "\ue000"           # both ends of a run of other characters, in the normalized text and the vocabulary
# a character of an "other" run (tokenize.split_runs): not Han, punctuation, symbol, space, dropped, MARK
OTHER = HAN.replace("[", "[^", 1)[:-1] + r"\p{P}\p{S}\s\p{Cc}\p{Cf}\x{FE00}-\x{FE0F}\x{E000}]"


def _is_other_unit(token: str) -> bool:
    """A unit that split_runs makes of a run of other characters (not Han, punctuation, space or dropped)."""
    return token not in SPECIAL_TOKENS and split_runs(token) == [(token, False)] and not is_punct(token[0])


def spellings(source: SourceTokenizer) -> list[str]:
    """The source units in id order as the exported tokenizer spells them: other-character runs between MARKs."""
    return [f"{MARK}{t}{MARK}" if _is_other_unit(t) else t for t in source.vocab.tokens]


def source_tokenizer(source: SourceTokenizer) -> Tokenizer:
    """A `tokenizers.Tokenizer` whose `.encode(text)` gives `source.analyse(text)`'s units (`.tokens`) and ids."""
    if source.mode != "unigram":
        raise ValueError(f"only the unigram segmenter has a tokenizers form, not {source.mode!r}")
    scores, _ = log_probs(source.word_counts)
    vocab = [(spelled, scores.get(token, OTHER_SCORE if token not in SPECIAL_TOKENS else 0.0))
             for token, spelled in zip(source.vocab.tokens, spellings(source), strict=True)]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=UNK, byte_fallback=False))
    ascii_marks = [normalizers.Replace(a, b) for a, b in _ASCII_TO_FULLWIDTH.items()]
    tokenizer.normalizer = normalizers.Sequence([
        normalizers.Strip(), normalizers.Replace(Regex(rf"(?<={HAN})\."), "。"), *ascii_marks,
        normalizers.Replace(Regex(rf"(?<!{OTHER})(?={OTHER})"), MARK),      # a run of other characters
        normalizers.Replace(Regex(rf"(?<={OTHER})(?!{OTHER})"), MARK),      # starts and ends with MARK
    ])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[／/\s\p{Cc}\p{Cf}\x{FE00}-\x{FE0F}]+"), "removed"),
        pre_tokenizers.Split(Regex(r"[\p{P}\p{S}]"), "isolated"),
        pre_tokenizers.Split(Regex(f"{HAN}+"), "isolated"),
    ])
    tokenizer.decoder = decoders.Replace(MARK, "")
    return tokenizer


def target_tokenizer(target) -> Tokenizer:
    """The target BPE itself (glassformer's TargetTokenizer wraps a `tokenizers.Tokenizer`)."""
    return Tokenizer.from_str(target.to_str())


def differences(source: SourceTokenizer, texts, tokenizer: Tokenizer | None = None) -> list[tuple[str, list, list]]:
    """(text, glassformer's units, the Unigram tokens) for every text where they differ."""
    tokenizer = tokenizer or source_tokenizer(source)
    unk = SPECIAL_TOKENS[UNK]
    out = []
    for text in texts:
        enc = source.analyse(text)
        theirs = tokenizer.encode(text)
        ours = [unk if i == UNK else u for u, i in zip(enc.units, enc.ids, strict=True)]
        tokens = [unk if i == UNK else t.strip(MARK) for t, i in zip(theirs.tokens, theirs.ids, strict=True)]
        if theirs.ids != enc.ids or tokens != ours:
            out.append((text, ours, tokens))
    return out


__all__ = ["HAN", "MARK", "differences", "is_han", "source_tokenizer", "spellings", "target_tokenizer"]
