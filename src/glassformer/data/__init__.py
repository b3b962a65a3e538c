"""data: what the translator reads and writes — the pinned corpora (sources, corpus, datasets), the tokenizers
(tokenize: glassformer's segmenter and BPE; sentencepiece: a Marian model's pieces), token-count batching, and
run folders (checkpoint: config, vocabularies and weights on disk).

May import: model, lesson (the lesson's sentences are held out of the corpus), and the base modules
(errors, limits, validation). Never decoding, training, interpret, interop, lab."""
