"""interpret: how a translation was made, for any glassformer model and its tokenizers (trained here or
imported from Marian) — explain (the lesson's walk row by row), activation patching, attribution (saliency,
input x gradient, integrated gradients, attention), the logit lens, and their commands.

May import: decoding, data, model, lesson (its default sentences), inference, and the base modules. Never
training, interop, lab."""
