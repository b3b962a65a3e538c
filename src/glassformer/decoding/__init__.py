"""decoding: text in, text out — search (greedy and beam strategies apart from one generate() loop over the
KV cache), the Translator (segmentation, length checks, batching, detokenization), evaluate (sacreBLEU), and
the `translate` / `evaluate` commands.

May import: data, inference (the speed layer), model, and the base modules. Never training, interpret,
interop, lab."""
