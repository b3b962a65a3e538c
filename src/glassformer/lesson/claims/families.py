"""Chapter F, model families: encoder-only, decoder-only and encoder–decoder from the same layers."""

from __future__ import annotations

import torch

from ...model.config import ModelConfig
from ...model.layers import DecoderLayer, EncoderLayer
from ...model.transformer import DecoderOnlyModel, EncoderOnlyModel, Transformer, build_model
from .common import diff
from .registry import Reading, check, reading


@check("F1", "encoder-only, decoder-only, encoder–decoder from the same layers")
def families_share_layers() -> Reading:
    cfg = ModelConfig.tiny(src_vocab=12, tgt_vocab=12, attention_path="glass")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(16)
        models = {fam: build_model(cfg.replace(family=fam)).double().eval()
                  for fam in ("encoder-only", "decoder-only", "encoder-decoder")}
    enc, dec, ed = models["encoder-only"], models["decoder-only"], models["encoder-decoder"]
    same_parts = (isinstance(enc, EncoderOnlyModel) and isinstance(dec, DecoderOnlyModel)
                  and isinstance(ed, Transformer)
                  and all(type(layer) is EncoderLayer for layer in [*enc.encoder.layers, *ed.encoder.layers])
                  and all(type(layer) is DecoderLayer for layer in [*dec.decoder.layers, *ed.decoder.layers])
                  and all(layer.cross_attention is None for layer in dec.decoder.layers)
                  and all(layer.cross_attention is not None for layer in ed.decoder.layers))
    ids = torch.tensor([[3, 5, 7, 4, 6]])
    last = ids.clone()
    last[0, -1] = 9
    with torch.no_grad():
        bidirectional = diff(enc(ids)[0, 0], enc(last)[0, 0])
        causal = diff(dec(ids)[0, :-1], dec(last)[0, :-1])
        cross = diff(ed(ids, ids)[0], ed(last, ids)[0])
    heads = (enc(ids).shape[-1], dec(ids).shape[-1])
    return reading("same EncoderLayer/DecoderLayer classes: {same_parts}; changing the last token moves position 0: "
                   "encoder-only {bidirectional:.3f}, decoder-only {causal:Δ}; source change moves encoder–decoder "
                   "logits {cross:.3f}",
                   same_parts and bidirectional > 1e-4 and causal == 0 and cross > 1e-4 and heads == (12, 12),
                   tolerance={"moves": 1e-4}, same_parts=same_parts, bidirectional=bidirectional, causal=causal,
                   cross=cross)


