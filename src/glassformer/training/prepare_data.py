"""The data a training recipe prepares (the presets themselves: presets.py).

`prepare_data` builds the tokenizers from the training data only and encodes the training pairs
(HSK train split, Tatoeba's training pairs, CC-CEDICT word glosses, as the recipe says); dev pairs
are kept for the score after each epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..data.batching import Example
from ..data.tokenize import SPECIAL_TOKENS, SourceTokenizer, TargetTokenizer, Vocab, is_han
from .settings import TrainSettings

GLOSS_MAX_TOKENS = 10   # longer dictionary glosses are definitions, not translations: left out


# ---- data ----------------------------------------------------------------------------------
@dataclass
class Data:
    """Tokenizers, training examples and the dev pairs scored every epoch."""

    source: SourceTokenizer
    target: TargetTokenizer
    examples: list[Example]
    dev: list = field(default_factory=list)
    finish: list[Example] = field(default_factory=list)    # the HSK examples alone (recipe.hsk_finish epochs)
    counts: dict[str, int] = field(default_factory=dict)


def build_source_tokenizer(hsk_units: list[list[str]], other_texts: list[str],
                           extra_words: list[str] = ()) -> SourceTokenizer:
    """Source vocabulary over all training data, so no Chinese character of it becomes <unk>.

    The HSK corpus's own segmentation defines the words; other Chinese text is cut over those words
    (unknown words fall apart into characters); the vocabulary holds every resulting unit plus every
    Han character of the data and of ``extra_words`` (dictionary headwords), characters at count 1.
    """
    words = SourceTokenizer.train(hsk_units)
    sequences = hsk_units + [words.segment(text) for text in other_texts]
    counted = SourceTokenizer.train(sequences)
    return with_characters(counted, sequences + [[w] for w in extra_words])


def han_runs(texts: list[str]) -> list[str]:
    """The Chinese runs of the texts, as the segmenter sees them (punctuation, Latin and digits cut off)."""
    from ..data.tokenize import normalize_punct, split_runs

    return [run for text in texts for run, han in split_runs(normalize_punct(text)) if han]


def train_sentencepiece(runs: list[str], pieces: int):
    """A SentencePiece unigram model of about ``pieces`` pieces over Chinese runs (a SentencePieceProcessor)."""
    import io

    import sentencepiece as spm

    from ..errors import UsageError

    characters = len({c for run in runs for c in run})
    if pieces <= characters:
        raise UsageError(f"--source-pieces: {pieces} pieces cannot hold the {characters} distinct characters of the "
                         f"training text; use more than {characters}", "source_pieces")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(runs), model_writer=model, vocab_size=pieces, model_type="unigram",
        character_coverage=1.0, add_dummy_prefix=False, split_by_whitespace=False, max_sentencepiece_length=8,
        num_threads=1, minloglevel=2, hard_vocab_limit=False)
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def sentencepiece_tokenizer(texts: list[str], pieces: int, extra_words: list[str] = ()) -> SourceTokenizer:
    """Source units from a SentencePiece unigram model of about ``pieces`` pieces, trained on the Chinese runs
    of the training text.

    Each Han piece keeps a count proportional to exp(its log-probability score), so the tokenizer's
    most-probable-path segmentation is SentencePiece's own Viterbi segmentation (tested); the run folder
    stays JSON (the `sentencepiece` package trains such a vocabulary, it is not needed to use it). Every
    Han character of ``extra_words`` (dictionary headwords) joins at count 1, as for the corpus words.
    """
    import math

    processor = train_sentencepiece(han_runs(texts), pieces)
    counts: dict[str, int] = {}
    for i in range(processor.get_piece_size()):
        piece = processor.id_to_piece(i).replace("\u2581", "")
        if piece and all(map(is_han, piece)) and not (processor.is_control(i) or processor.is_unknown(i)):
            counts[piece] = max(counts.get(piece, 0), max(1, round(math.exp(processor.get_score(i)) * 1e9)))
    ordered = sorted(counts, key=lambda w: (-counts[w], w))
    return with_characters(SourceTokenizer(Vocab(ordered, counts)), [[w] for w in ordered] + [[w] for w in extra_words])


def prepare_data(recipe: TrainSettings, limit: int | None = None, vocab: dict | None = None) -> Data:
    """Load the corpora, build (or restore) the tokenizers, encode the training pairs (+ glosses).

    Training data: the HSK train split (``hsk_repeat`` times), the Tatoeba training pairs if the recipe
    says so (``limit`` caps both, for tests), CC-CEDICT glosses. Dev is the HSK dev split, for scoring.
    """
    from ..data.corpus import load_corpus

    corpus = load_corpus()
    hsk = corpus.train[:limit] if limit else corpus.train
    tatoeba = []
    if recipe.tatoeba:
        from ..data.datasets import load_tatoeba_splits

        tatoeba = load_tatoeba_splits().train
        tatoeba = tatoeba[:limit] if limit else tatoeba
    entries = []
    if recipe.glosses or (recipe.char_fallback and vocab is None):
        from ..data.sources import load_cedict

        entries = load_cedict()
    if vocab is not None:
        source = SourceTokenizer.from_dict(vocab["source"])
        target = TargetTokenizer.from_dict(vocab["target"])
    else:
        from ..data.datasets import dictionary_characters

        single = dictionary_characters(entries) if recipe.char_fallback else []
        if recipe.source_pieces:
            source = sentencepiece_tokenizer([p.zh for p in hsk] + [p.zh for p in tatoeba], recipe.source_pieces,
                                             single)
        else:
            source = build_source_tokenizer([p.zh_units for p in hsk], [p.zh for p in tatoeba], single)
        if not recipe.char_fallback and not recipe.source_pieces:
            source = SourceTokenizer.train([p.zh_units for p in hsk] + [source.segment(p.zh) for p in tatoeba])
    glosses: dict[str, str] = {}
    if recipe.glosses:
        from ..data.datasets import dictionary_glosses

        words = {w for w in source.vocab.tokens if all(map(is_han, w))}
        glosses = dict(sorted(dictionary_glosses(entries, words).items()))
    if vocab is None:
        english = [p.en for p in hsk] + [p.en for p in tatoeba] + list(glosses.values())
        target = TargetTokenizer.train(english, recipe.bpe_vocab)
    examples = []
    for p in hsk:
        units = p.zh_units if recipe.source_units == "gold" else source.segment(p.zh)
        tgt = target.encode(p.en)
        examples.extend(Example(source.vocab.encode(units), tgt) for _ in range(recipe.hsk_repeat))
        if recipe.char_fallback:
            chars = [c for u in units for c in (list(u) if all(map(is_han, u)) else [u])]
            if chars != units:
                examples.append(Example(source.vocab.encode(chars), tgt))
    n_hsk = len(examples)                                   # the HSK examples come first
    for p in tatoeba:
        examples.append(Example(source.encode(p.zh), target.encode(p.en)))
    n_glosses = 0
    for word, gloss in glosses.items():
        ids = target.encode(gloss)
        if len(ids) <= GLOSS_MAX_TOKENS:
            examples.append(Example(source.vocab.encode([word]), ids))
            n_glosses += 1
    max_len = recipe.model.max_len
    kept = [e for e in examples if e.width <= max_len]
    finish = [e for e in examples[:n_hsk] if e.width <= max_len]
    return Data(source, target, kept, corpus.dev, finish,
                {"pairs": len(hsk) + len(tatoeba), "hsk_pairs": len(hsk), "tatoeba_pairs": len(tatoeba),
                 "glosses": n_glosses, "examples": len(kept), "finish_examples": len(finish),
                 "dropped_too_long": len(examples) - len(kept),
                 "target_tokens": sum(len(e.tgt) + 1 for e in kept)})


def with_characters(source: SourceTokenizer, unit_sequences) -> SourceTokenizer:
    """The same tokenizer plus every Han character of the given units as a unit of count 1.

    Known words keep their counts, so segmentation of known words is unchanged; an unknown word is
    then cut into known characters instead of falling back to <unk>.
    """
    words = source.vocab.tokens[len(SPECIAL_TOKENS):]
    chars = sorted({c for units in unit_sequences for u in units for c in u if is_han(c)} - set(words))
    counts = {**{c: 1 for c in chars}, **source.vocab.counts}
    return SourceTokenizer(Vocab(words + chars, counts), source.mode)
