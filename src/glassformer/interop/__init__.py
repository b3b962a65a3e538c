"""interop: models in and out of glassformer — Hugging Face Marian folders (OPUS-MT) in, transformers and
CTranslate2 folders out (docs/interop.md).

- `marian`: the parameter names and config fields of MarianMTModel against glassformer's;
- `importer`: `glassformer import HF_DIR --out RUN_DIR`;
- `export`: `glassformer export --model RUN_DIR --to transformers|ctranslate2 --out DIR`;
- `segmenter`: glassformer's own source segmenter as a `tokenizers` Unigram tokenizer (source_tokenizer.json).

A run folder is read by data/ (data/sentencepiece.py holds a Marian model's tokenizers), so loading one
needs nothing from here; `transformers` and `ctranslate2` are optional extras, used by nothing here at run
time (the tests use them as the reference).

May import: data, model, and the base modules. Never decoding, training, interpret, lab.
"""
