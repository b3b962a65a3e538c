"""What a patching scan patches and what one cell of it holds: shared by activation patching (patching.py)
and its gradient estimate (attribution_patching.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError

FLAT = 1e-9                     # |p_clean − p_corrupt| below this: the corruption changed nothing to restore


def head_sites(model) -> list[list[str]]:
    """[layer][head] -> the probe name of that cross-attention head's output."""
    cfg = model.cfg
    return [[f"decoder.{i}.cross_attention.head.{h}.output" for h in range(cfg.heads)]
            for i in range(cfg.decoder_layers)]


def position_layers(model) -> list[str]:
    """The encoder's residual stream, layer by layer: the embedding, then each layer's output."""
    return ["encoder.embedding", *(f"encoder.{i}.output" for i in range(model.cfg.encoder_layers))]


def scan_sites(model, clean_src, corrupt_src, tgt_in, row: int, positions: bool
               ) -> tuple[list[list[str]], list[str], list[str]]:
    """A scan's sites after its checks (same unit counts when positions are patched, the row inside the
    target input), the model in eval mode: heads[layer][head], every head's name, the position layers."""
    if positions and clean_src.shape != corrupt_src.shape:
        raise UsageError(f"positions: the clean sentence has {clean_src.size(1)} units and the corrupted one "
                         f"{corrupt_src.size(1)}; patching positions needs the same count", "positions")
    if not 0 <= row < tgt_in.size(1):
        raise UsageError(f"row {row} is outside the target input of {tgt_in.size(1)} positions")
    model.eval()
    heads = head_sites(model)
    return heads, [name for layer in heads for name in layer], position_layers(model) if positions else []


@dataclass
class Patched:
    """One patch: the probability it gives and the fraction of the clean–corrupt gap it restores."""

    p: float
    fraction: float | None          # None when the corruption moved p by less than FLAT

    def to_json(self) -> dict:
        return {"p": self.p, "fraction": self.fraction}
