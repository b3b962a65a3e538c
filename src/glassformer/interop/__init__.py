"""Models in and out of glassformer: Hugging Face Marian folders (OPUS-MT) in, transformers and
CTranslate2 folders out (docs/interop.md).

- `spm`: SentencePiece tokenizers with MarianTokenizer's ids, as a run folder's source and target side;
- `marian`: the parameter names and config fields of MarianMTModel against glassformer's;
- `importer`: `glassformer import HF_DIR --out RUN_DIR`;
- `export`: `glassformer export --model RUN_DIR --to transformers|ctranslate2 --out DIR`;
- `segmenter`: glassformer's own source segmenter as a `tokenizers` Unigram tokenizer (source_tokenizer.json).

Only `spm` is needed to load a run folder; `transformers` and `ctranslate2` are optional extras, used by
nothing here at run time (the tests use transformers as the reference).
"""
