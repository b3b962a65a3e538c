"""glassformer's source segmenter and target BPE in the `tokenizers` library's format, for exported models.

The target side already is a `tokenizers` BPE: its JSON is written as it is. The source side
(translation/tokenize.py: punctuation normalised, cut at typed separators, punctuation and symbols
alone, Han runs segmented by the most probable split over the training word counts) becomes a
`tokenizers` pipeline: normalizers for the punctuation, pre-tokenizers for the cuts, and a Unigram
model whose scores are the same log-probabilities log(count / total).

Where the two can differ (measured over the corpora, docs/interop.md): the Unigram model scores a
character it does not know at (lowest score - 10) where glassformer uses log(0.5 / total); a run of
Latin letters or digits that is not a unit is one `<unk>` in glassformer, while Unigram cuts it into
known pieces where it can; a piece the user typed between separators is cut again by Unigram even when
it is a known unit.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

from ..translation.tokenize import _ASCII_TO_FULLWIDTH, SPECIAL_TOKENS, UNK, SourceTokenizer, is_han, log_probs

# the Han ranges of tokenize.is_han, as a regular-expression class
HAN = r"[\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{F900}-\x{FAFF}\x{20000}-\x{323AF}]"
OTHER_SCORE = -1.0        # a non-Han unit: a whole run beats any cut of it into several units


def source_tokenizer(source: SourceTokenizer) -> Tokenizer:
    """A `tokenizers.Tokenizer` whose `.encode(text)` gives `source.analyse(text)`'s units (`.tokens`) and ids."""
    if source.mode != "unigram":
        raise ValueError(f"only the unigram segmenter has a tokenizers form, not {source.mode!r}")
    tokens = source.vocab.tokens
    scores, _ = log_probs(source.word_counts)
    vocab = [(token, scores.get(token, OTHER_SCORE if token not in SPECIAL_TOKENS else 0.0)) for token in tokens]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=UNK, byte_fallback=False))
    ascii_marks = [normalizers.Replace(a, b) for a, b in _ASCII_TO_FULLWIDTH.items()]
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Strip(), normalizers.Replace(Regex(rf"(?<={HAN})\."), "。"), *ascii_marks])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[／/\s\p{Cc}\p{Cf}\x{FE00}-\x{FE0F}]+"), "removed"),
        pre_tokenizers.Split(Regex(r"[\p{P}\p{S}]"), "isolated"),
        pre_tokenizers.Split(Regex(f"{HAN}+"), "isolated"),
    ])
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
        tokens = [unk if i == UNK else t for t, i in zip(theirs.tokens, theirs.ids, strict=True)]
        if theirs.ids != enc.ids or tokens != ours:
            out.append((text, ours, tokens))
    return out


__all__ = ["HAN", "differences", "is_han", "source_tokenizer", "target_tokenizer"]
