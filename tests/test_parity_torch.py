"""Parity with an implementation nobody here wrote: PyTorch's nn.Transformer layers, float64, 1e-10."""

import pytest
import torch
from torch import nn

from glassformer.model import DecoderLayer, EncoderLayer, ModelConfig, Transformer, causal_mask

D, H, FF = 16, 4, 40


def cfg(norm: str, **kw) -> ModelConfig:
    return ModelConfig(d_model=D, heads=H, d_ff=FF, dropout=0.0, norm_placement=norm, src_vocab=30, tgt_vocab=30,
                       encoder_layers=2, decoder_layers=2, **kw)


def copy_attention(ours, theirs: nn.MultiheadAttention) -> None:
    """nn.MultiheadAttention's fused [W^Q | W^K | W^V] rows into our W^Q, W^K, W^V; out_proj into W^O."""
    w, b = theirs.in_proj_weight.data.chunk(3), theirs.in_proj_bias.data.chunk(3)
    ours.load_state_dict({"w_q.weight": w[0], "w_k.weight": w[1], "w_v.weight": w[2],
                          "w_q.bias": b[0], "w_k.bias": b[1], "w_v.bias": b[2],
                          "w_o.weight": theirs.out_proj.weight.data, "w_o.bias": theirs.out_proj.bias.data})


def copy_linear_norms(ours, theirs, norms: list[str]) -> None:
    ours.ffn.w_1.load_state_dict(theirs.linear1.state_dict())
    ours.ffn.w_2.load_state_dict(theirs.linear2.state_dict())
    for i, name in enumerate(norms):
        ours.sublayer[i].layer_norm.load_state_dict(getattr(theirs, name).state_dict())


def randomise(module: nn.Module) -> None:
    """Give every parameter (biases and LayerNorm affine included) non-trivial values."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3)


def load_encoder_layer(ours: EncoderLayer, theirs: nn.TransformerEncoderLayer) -> None:
    copy_attention(ours.self_attention, theirs.self_attn)
    copy_linear_norms(ours, theirs, ["norm1", "norm2"])


def load_decoder_layer(ours: DecoderLayer, theirs: nn.TransformerDecoderLayer) -> None:
    copy_attention(ours.self_attention, theirs.self_attn)
    copy_attention(ours.cross_attention, theirs.multihead_attn)
    copy_linear_norms(ours, theirs, ["norm1", "norm2", "norm3"])


def padded_batch(b=3, n=7):
    x = torch.randn(b, n, D, dtype=torch.float64)
    pad = torch.zeros(b, n, dtype=torch.bool)
    pad[1, 5:] = True
    pad[2, 3:] = True
    return x, pad


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("path", ["fast", "glass"])
def test_encoder_layer_matches_torch(norm, path):
    theirs = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=(norm == "pre"))
    theirs = theirs.double().eval()
    randomise(theirs)
    ours = EncoderLayer(cfg(norm, attention_path=path)).double().eval()
    load_encoder_layer(ours, theirs)
    x, pad = padded_batch()
    with torch.no_grad():
        expected = theirs(x, src_key_padding_mask=pad)
        got = ours(x, mask=(~pad)[:, None, None, :])
    real = ~pad
    assert torch.allclose(got[real], expected[real], atol=1e-10, rtol=0)


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("path", ["fast", "glass"])
def test_decoder_layer_matches_torch(norm, path):
    theirs = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=(norm == "pre"))
    theirs = theirs.double().eval()
    randomise(theirs)
    ours = DecoderLayer(cfg(norm, attention_path=path)).double().eval()
    load_decoder_layer(ours, theirs)
    memory, mem_pad = padded_batch(3, 7)
    y = torch.randn(3, 5, D, dtype=torch.float64)
    tri = causal_mask(5)
    with torch.no_grad():
        expected = theirs(y, memory, tgt_mask=~tri, memory_key_padding_mask=mem_pad)
        got = ours(y, memory, None, (~mem_pad)[:, None, None, :], causal=True)
    assert torch.allclose(got, expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_whole_nn_transformer_matches(norm):
    """nn.Transformer ends each stack with a LayerNorm even in post-norm: final_norm=True matches it."""
    theirs = nn.Transformer(D, H, 2, 2, FF, dropout=0.0, batch_first=True, norm_first=(norm == "pre"))
    theirs = theirs.double().eval()
    randomise(theirs)
    ours = Transformer(cfg(norm, final_norm=True)).double().eval()
    for i in range(2):
        load_encoder_layer(ours.encoder.layers[i], theirs.encoder.layers[i])
        load_decoder_layer(ours.decoder.layers[i], theirs.decoder.layers[i])
    ours.encoder.norm.load_state_dict(theirs.encoder.norm.state_dict())
    ours.decoder.norm.load_state_dict(theirs.decoder.norm.state_dict())
    src, src_pad = padded_batch(3, 7)
    tgt = torch.randn(3, 6, D, dtype=torch.float64)
    with torch.no_grad():
        expected = theirs(src, tgt, tgt_mask=~causal_mask(6), src_key_padding_mask=src_pad,
                          memory_key_padding_mask=src_pad)
        memory = ours.encoder(src, src_pad)
        got = ours.decoder(tgt, memory, src_pad)
    assert torch.allclose(got, expected, atol=1e-10, rtol=0)


def test_post_norm_default_has_no_final_norm_but_pre_does():
    """The 2017 paper's post-norm stack ends with its last sub-layer's LN; pre-norm needs one more."""
    assert Transformer(cfg("post")).encoder.norm is None
    assert Transformer(cfg("pre")).encoder.norm is not None
    assert Transformer(cfg("post", final_norm=True)).decoder.norm is not None
