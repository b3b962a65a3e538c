"""What a patching scan patches and what one cell of it holds: shared by activation patching (patching.py)
and its gradient estimate (attribution_patching.py)."""

from __future__ import annotations

from dataclasses import dataclass

FLAT = 1e-9                     # |p_clean − p_corrupt| below this: the corruption changed nothing to restore


def head_sites(model) -> list[list[str]]:
    """[layer][head] -> the probe name of that cross-attention head's output."""
    cfg = model.cfg
    return [[f"decoder.{i}.cross_attention.head.{h}.output" for h in range(cfg.heads)]
            for i in range(cfg.decoder_layers)]


def position_layers(model) -> list[str]:
    """The encoder's residual stream, layer by layer: the embedding, then each layer's output."""
    return ["encoder.embedding", *(f"encoder.{i}.output" for i in range(model.cfg.encoder_layers))]


@dataclass
class Patched:
    """One patch: the probability it gives and the fraction of the clean–corrupt gap it restores."""

    p: float
    fraction: float | None          # None when the corruption moved p by less than FLAT

    def to_json(self) -> dict:
        return {"p": self.p, "fraction": self.fraction}
