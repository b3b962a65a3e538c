"""Files a Marian folder has beside its weights, for tests that import one made from a glassformer export."""

from __future__ import annotations

import json
from pathlib import Path


def marian_tokenizer_files(folder: Path, source, target) -> None:
    """Files MarianTokenizer would have (the import reads them): SentencePiece models and vocabularies."""
    import sentencepiece as spm

    text = folder / "text.txt"
    text.write_text("我 你 他\nI you he\n" * 20, encoding="utf-8")
    for name in ("source", "target"):
        spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(folder / name), vocab_size=24,
                                       minloglevel=2, hard_vocab_limit=False)
        (folder / f"{name}.model").rename(folder / f"{name}.spm")
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(source.vocab.tokens)}))
    tvocab = {target.id_to_token(i): i for i in range(target.vocab_size)}
    (folder / "target_vocab.json").write_text(json.dumps(tvocab))
    (folder / "tokenizer_config.json").write_text(json.dumps({"separate_vocabs": True}))
