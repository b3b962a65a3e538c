"""Training recipes: presets of the training settings (settings.py), each a partial value of its schema.

Plain data: this module imports nothing, so the settings (which name the presets) and the data
preparation (which reads a recipe) both stand on it without a loop.
"""

from __future__ import annotations

from typing import Any

# Each preset is a partial value of settings.TrainSettings: what it changes of the schema defaults (a plain
# run on the HSK pairs: d 128, 2+2 layers, no glosses, no Tatoeba). The "note" is printed when a run starts.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        model=dict(d_model=32, d_ff=64, dropout=0.0, max_len=64),
        epochs=1, max_tokens=512, lr_factor=1.0, warmup=50, bpe_vocab=300,
        note="for tests: seconds on a CPU"),
    "anchor": dict(
        epochs=30, lr_factor=0.5, warmup=400, bpe_vocab=2000, source_units="gold",
        note="the plain-Transformer anchor's sizes: HSK only, gold segmentation, no glosses"),
    "hsk": dict(
        model=dict(dropout=0.3),
        epochs=40, lr_factor=0.5, warmup=400, bpe_vocab=2000, glosses=True, char_fallback=True, average=5,
        note="HSK pairs only (the former default): about 7 minutes on 2 idle CPU cores"),
    "default": dict(
        model=dict(d_model=192, d_ff=768),
        epochs=8, cooldown=0.3, char_fallback=True, tatoeba=True, hsk_repeat=3, average=1,
        note="the demo model: d 192, HSK x3 + Tatoeba, 8 epochs, the learning rate cooled to zero over the last 30 % "
             "of steps, the last weights kept; 6,021 steps, about 26 minutes on 2 cores with --compile (make demo's), "
             "longer without"),
    "large": dict(
        model=dict(d_model=256, d_ff=1024, encoder_layers=3, decoder_layers=3),
        epochs=12, max_tokens=2048, bpe_vocab=6000, glosses=True, char_fallback=True, tatoeba=True, hsk_repeat=3,
        average=3,
        note="best quality on this machine: d 256, 3+3 layers, 12 epochs, the last 3 averaged; about an hour "
             "on 2 idle CPU cores"),
}
