"""The decoder read layer by layer (the logit lens): what one target row would predict after each sub-layer.

Each decoder layer has three sub-layers (0 masked self-attention, 1 cross-attention, 2 FFN). After each,
the row's vector is put through the vocabulary head (`model.logits`) and softmaxed, and the probability of
the chosen token (and of a contrast token) is read:

- post-norm: the sub-layer's output is already normalised, `decoder.{i}.sublayer.{j}.normed` is read
  directly (through the decoder's final LayerNorm too, if a post-norm model has one);
- pre-norm: the residual stream `decoder.{i}.sublayer.{j}.residual` is not, so the decoder's final
  LayerNorm (`model.decoder.norm`) is applied first, as the model does before its head.

The reading after the last sub-layer is therefore the model's own probability.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor

from ..errors import UsageError

SUBLAYERS = ("self-attention", "cross-attention", "ffn")


def lens_reading(model) -> str:
    """How the stream is read, in words (post-norm vs pre-norm)."""
    final = getattr(model.decoder, "norm", None) is not None
    if model.cfg.norm_placement == "post":
        return ("post-norm: each sub-layer's LayerNorm output, read directly"
                + (" (then the decoder's final LayerNorm)" if final else ""))
    return "pre-norm: the residual stream after each sub-layer, through the decoder's final LayerNorm"


def _site(model, layer: int, sublayer: int) -> str:
    part = "normed" if model.cfg.norm_placement == "post" else "residual"
    return f"decoder.{layer}.sublayer.{sublayer}.{part}"


@torch.no_grad()
def logit_lens(model, src: Tensor, tgt_in: Tensor, row: int, token: int, contrast: int | None = None,
               src_pad: Tensor | None = None) -> dict[str, Any]:
    """p(token) (and p(contrast)) at target row `row` after every decoder sub-layer; the model's own p too.

    src: (1, src), tgt_in: (1, tgt). Returns {"reading", "row", "steps": [{layer, sublayer, name, p,
    p_contrast}], "p_model", "p_contrast_model"}."""
    if not 0 <= row < tgt_in.size(1):
        raise UsageError(f"row: {row} is outside the target rows 0..{tgt_in.size(1) - 1}", "row")
    model.eval()
    n_sub = sum(1 for name in model.hook_names() if re.fullmatch(r"decoder\.0\.sublayer\.\d+\.normed", name))
    sites = [(i, j, _site(model, i, j)) for i in range(model.cfg.decoder_layers) for j in range(n_sub)]
    with model.probes(*[name for _, _, name in sites]) as rec:
        logits = model(src, tgt_in, src_pad)                                # (1, tgt, vocab)
    norm = getattr(model.decoder, "norm", None)
    steps = []
    for i, j, name in sites:
        h = rec[name][:, row]                                               # (1, d)
        if norm is not None:
            h = norm(h)
        p = torch.softmax(model.logits(h)[0].double(), dim=-1)              # (vocab,)
        steps.append({"layer": i, "sublayer": j, "name": SUBLAYERS[j] if n_sub == 3 else f"sublayer {j}",
                      "p": float(p[token]), "p_contrast": float(p[contrast]) if contrast is not None else None})
    p_model = torch.softmax(logits[0, row].double(), dim=-1)
    return {"reading": lens_reading(model), "row": row, "steps": steps, "p_model": float(p_model[token]),
            "p_contrast_model": float(p_model[contrast]) if contrast is not None else None}
