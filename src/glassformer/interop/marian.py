"""MarianMTModel (transformers' `models/marian/modeling_marian.py`) against glassformer's Transformer:
the config fields and the parameter names, both ways.

Marian is the 2017 post-norm model with SiLU ("swish") or ReLU, embeddings scaled by sqrt(d), no final
LayerNorm, a bias on the vocabulary head (`final_logits_bias`) and sinusoidal positions laid out as
[all sines | all cosines]. Imported models keep that layout (`position_layout="halves"`). A glassformer
model with interleaved positions is exported by permuting the residual stream's channels: channel
2r -> r, 2r+1 -> d/2 + r, applied to every weight that reads the stream (columns of embeddings, W^Q,
W^K, W^V, W_1 and the head) or writes it (rows and biases of W^O and W_2) and to every LayerNorm
(permutation-equivariant). The model computes the same function, exactly, in Marian's layout.
"""

from __future__ import annotations

import re

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from torch import Tensor

from ..errors import UsageError
from ..model import ModelConfig
from ..validation import usage_error

ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu"}   # Marian's name -> glassformer's
HF_EPS = 1e-5                                                      # transformers' Marian LayerNorms use the default
_PROJECTIONS = {"w_q": "q_proj", "w_k": "k_proj", "w_v": "v_proj", "w_o": "out_proj"}
_READS = ("w_q", "w_k", "w_v", "w_1")                              # weights whose input is the residual stream
_WRITES = ("w_o", "w_2")                                           # weights whose output is added to it


class MarianFields(BaseModel):
    """The fields of a Marian config.json that decide the model (others are ignored)."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    model_type: str
    vocab_size: int = Field(gt=0)
    decoder_vocab_size: int | None = Field(default=None, gt=0)
    d_model: int = Field(gt=0)
    encoder_layers: int = Field(gt=0)
    decoder_layers: int = Field(gt=0)
    encoder_attention_heads: int = Field(gt=0)
    decoder_attention_heads: int = Field(gt=0)
    encoder_ffn_dim: int = Field(gt=0)
    decoder_ffn_dim: int = Field(gt=0)
    max_position_embeddings: int = Field(gt=0)
    activation_function: str
    scale_embedding: bool = False
    share_encoder_decoder_embeddings: bool = True
    tie_word_embeddings: bool = True
    pad_token_id: int = Field(ge=0)
    eos_token_id: int = Field(ge=0)
    decoder_start_token_id: int = Field(ge=0)
    dropout: float = Field(default=0.1, ge=0, lt=1)
    attention_dropout: float = Field(default=0.0, ge=0, lt=1)
    normalize_before: bool = False           # written by older converters; Marian in transformers is post-norm
    normalize_embedding: bool = False
    add_final_layer_norm: bool = False
    static_position_embeddings: bool = True


def model_config(data: object, source: str) -> ModelConfig:
    """The ModelConfig of a Marian config.json; every size checked (limits included) before anything exists."""
    try:
        hf = MarianFields.model_validate(data)
    except ValidationError as error:
        raise usage_error(error, source) from None
    if hf.model_type != "marian":
        raise UsageError(f"{source}: model_type is {hf.model_type!r}; only Marian models (\"marian\") can be imported",
                         "model_type")
    pairs = (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim"))
    for a, b in pairs:
        if getattr(hf, a) != getattr(hf, b):
            raise UsageError(f"{source}: {a} {getattr(hf, a)} differs from {b} {getattr(hf, b)}; glassformer "
                             "uses one value for both stacks", b)
    for name, wrong in (("normalize_before", True), ("normalize_embedding", True), ("add_final_layer_norm", True),
                        ("static_position_embeddings", False)):
        if getattr(hf, name) is wrong:
            raise UsageError(f"{source}: {name} is {str(wrong).lower()}; only post-norm Marian models with static "
                             "sinusoidal positions and no extra LayerNorm can be imported", name)
    if hf.activation_function not in ACTIVATIONS:
        raise UsageError(f"{source}: activation_function {hf.activation_function!r} is not one of "
                         f"{sorted(ACTIVATIONS)}", "activation_function")
    if hf.d_model % hf.encoder_attention_heads or hf.d_model % 2:
        raise UsageError(f"{source}: d_model {hf.d_model} must be even and a multiple of the heads "
                         f"({hf.encoder_attention_heads})", "d_model")
    shared = hf.share_encoder_decoder_embeddings
    tgt_vocab = hf.vocab_size if shared or hf.decoder_vocab_size is None else hf.decoder_vocab_size
    fields = dict(src_vocab=hf.vocab_size, tgt_vocab=tgt_vocab, d_model=hf.d_model, heads=hf.encoder_attention_heads,
                  d_ff=hf.encoder_ffn_dim, encoder_layers=hf.encoder_layers, decoder_layers=hf.decoder_layers,
                  dropout=float(hf.dropout), attention_dropout=float(hf.attention_dropout), norm_placement="post",
                  final_norm=False, eps=HF_EPS, positions="sinusoidal", max_len=hf.max_position_embeddings,
                  scale_embeddings=hf.scale_embedding, position_layout="halves",
                  activation=ACTIVATIONS[hf.activation_function], bias=True, head_bias=True,
                  tie_target=hf.tie_word_embeddings, share_embeddings=shared,
                  pad_id=hf.pad_token_id, bos_id=hf.decoder_start_token_id, eos_id=hf.eos_token_id)
    theirs = {"src_vocab": "vocab_size", "tgt_vocab": "vocab_size" if shared or hf.decoder_vocab_size is None
              else "decoder_vocab_size", "heads": "encoder_attention_heads", "d_ff": "encoder_ffn_dim",
              "max_len": "max_position_embeddings", "pad_id": "pad_token_id", "bos_id": "decoder_start_token_id",
              "eos_id": "eos_token_id"}                                # the rest have config.json's own names
    try:
        return ModelConfig.from_dict(fields, source)                  # types, ranges and limits: one line each
    except UsageError as error:                                       # named by config.json's keys, not ours
        message = re.sub(r"\b(" + "|".join(theirs) + r")\b", lambda m: theirs[m.group(1)], str(error))
        raise type(error)(message, theirs.get(error.field, error.field), status=error.status) from None


def refusal(cfg: ModelConfig) -> str | None:
    """Why MarianMTModel cannot express `cfg` (None when it can)."""
    checks = [
        (cfg.family != "encoder-decoder", f"family {cfg.family!r} (Marian is an encoder-decoder)"),
        (cfg.norm_placement != "post", "norm_placement 'pre' (Marian is post-norm)"),
        (cfg.use_final_norm, "a final LayerNorm after each stack (Marian has none)"),
        (cfg.positions != "sinusoidal", f"positions {cfg.positions!r} (Marian has fixed sinusoidal positions)"),
        (cfg.d_model % 2 != 0, f"an odd d_model {cfg.d_model}"),
        (not cfg.bias, "linear layers without bias (Marian's have biases)"),
        (not cfg.scale_scores, "unscaled attention scores (Marian divides by sqrt(d_k))"),
        (cfg.d_k * cfg.heads != cfg.d_model or cfg.d_v * cfg.heads != cfg.d_model,
         f"d_k {cfg.d_k} / d_v {cfg.d_v} times {cfg.heads} heads differing from d_model {cfg.d_model}"),
        (abs(cfg.eps - HF_EPS) > 1e-12, f"LayerNorm eps {cfg.eps} (transformers' Marian uses {HF_EPS})"),
    ]
    return next((why for bad, why in checks if bad), None)


def hf_config(cfg: ModelConfig) -> dict:
    """A Marian config.json for `cfg` (separate vocabularies unless they are one matrix; our special ids)."""
    return {"architectures": ["MarianMTModel"], "model_type": "marian", "vocab_size": cfg.src_vocab,
            "decoder_vocab_size": cfg.tgt_vocab, "share_encoder_decoder_embeddings": cfg.share_embeddings,
            "tie_word_embeddings": cfg.tie_target, "d_model": cfg.d_model, "encoder_layers": cfg.encoder_layers,
            "decoder_layers": cfg.decoder_layers, "encoder_attention_heads": cfg.heads,
            "decoder_attention_heads": cfg.heads, "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff,
            "activation_function": "swish" if cfg.activation == "silu" else "relu",
            "max_position_embeddings": cfg.max_len, "scale_embedding": cfg.scale_embeddings,
            "dropout": cfg.dropout, "attention_dropout": cfg.attention_dropout, "activation_dropout": 0.0,
            "pad_token_id": cfg.pad_id, "eos_token_id": cfg.eos_id, "decoder_start_token_id": cfg.bos_id,
            "forced_eos_token_id": cfg.eos_id, "bos_token_id": None, "is_encoder_decoder": True, "use_cache": True}


def generation_config(cfg: ModelConfig) -> dict:
    """generation_config.json: start, end and padding as the model's, PAD never generated, greedy by default."""
    return {"decoder_start_token_id": cfg.bos_id, "eos_token_id": cfg.eos_id, "forced_eos_token_id": cfg.eos_id,
            "pad_token_id": cfg.pad_id, "bad_words_ids": [[cfg.pad_id]], "num_beams": 1, "max_length": cfg.max_len}


# ---- parameter names ---------------------------------------------------------------------------
def layer_names(cfg: ModelConfig) -> dict[str, str]:
    """glassformer name -> Marian name of every per-layer parameter."""
    names: dict[str, str] = {}
    for stack, count in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        attentions = [("self_attention", "self_attn")] + ([("cross_attention", "encoder_attn")]
                                                          if stack == "decoder" else [])
        norms = ["self_attn_layer_norm"] + (["encoder_attn_layer_norm"] if stack == "decoder" else [])
        norms.append("final_layer_norm")
        for i in range(count):
            ours, theirs = f"{stack}.layers.{i}", f"model.{stack}.layers.{i}"
            for part in ("weight", "bias"):
                for module, hf_module in attentions:
                    for w, proj in _PROJECTIONS.items():
                        names[f"{ours}.{module}.{w}.{part}"] = f"{theirs}.{hf_module}.{proj}.{part}"
                names[f"{ours}.ffn.w_1.{part}"] = f"{theirs}.fc1.{part}"
                names[f"{ours}.ffn.w_2.{part}"] = f"{theirs}.fc2.{part}"
                for k, norm in enumerate(norms):
                    names[f"{ours}.sublayer.{k}.layer_norm.{part}"] = f"{theirs}.{norm}.{part}"
    return names


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Marian name -> shape for every tensor an import reads (embeddings under each name they may have)."""
    d, ff = cfg.d_model, cfg.d_ff
    shapes: dict[str, tuple[int, ...]] = {}
    for ours, theirs in layer_names(cfg).items():
        if ".ffn.w_1." in ours:
            shapes[theirs] = (ff, d) if ours.endswith("weight") else (ff,)
        elif ".ffn.w_2." in ours:
            shapes[theirs] = (d, ff) if ours.endswith("weight") else (d,)
        else:
            shapes[theirs] = (d, d) if ours.endswith("weight") and "layer_norm" not in ours else (d,)
    shapes.update({"model.shared.weight": (cfg.src_vocab, d), "model.encoder.embed_tokens.weight": (cfg.src_vocab, d),
                   "model.decoder.embed_tokens.weight": (cfg.tgt_vocab, d), "lm_head.weight": (cfg.tgt_vocab, d),
                   "final_logits_bias": (1, cfg.tgt_vocab),
                   "model.encoder.embed_positions.weight": (cfg.max_len, d),
                   "model.decoder.embed_positions.weight": (cfg.max_len, d)})
    return shapes


def embedding_sharing(cfg: ModelConfig, tensors: dict[str, Tensor]) -> ModelConfig:
    """`cfg` with share_embeddings off where the file holds two different embeddings for the encoder and the decoder:
    transformers 5 unties them (and model.shared) when tie_word_embeddings is false, even with
    share_encoder_decoder_embeddings; a file saved where they are one matrix holds one copy, or equal copies."""
    enc, dec = tensors.get("model.encoder.embed_tokens.weight"), tensors.get("model.decoder.embed_tokens.weight")
    if cfg.share_embeddings and enc is not None and dec is not None and not torch.equal(enc, dec):
        return cfg.replace(share_embeddings=False)
    return cfg


def to_glassformer(tensors: dict[str, Tensor], cfg: ModelConfig, source: str) -> dict[str, Tensor]:
    """A glassformer state dict (float32) from Marian tensors; a missing tensor is one UsageError."""
    def need(*names: str) -> Tensor:
        for name in names:
            if name in tensors:
                return tensors[name].to(torch.float32)
        raise UsageError(f"{source}: no tensor {names[0]!r}")

    state = {ours: need(theirs) for ours, theirs in layer_names(cfg).items()}
    src = need("model.encoder.embed_tokens.weight", "model.shared.weight")     # what each side's forward reads
    tgt = src if cfg.share_embeddings else need("model.decoder.embed_tokens.weight", "model.shared.weight")
    state["src_embed.token.weight"], state["tgt_embed.token.weight"] = src, tgt
    state["head.weight"] = tgt if cfg.tie_target else need("lm_head.weight")
    bias = tensors.get("final_logits_bias")
    state["head.bias"] = (bias.to(torch.float32).reshape(-1) if bias is not None
                          else torch.zeros(cfg.tgt_vocab))
    return state


def halves_permutation(d: int) -> Tensor:
    """Channel c of Marian's layout is channel perm[c] of the interleaved one: [0, 2, 4, ..., 1, 3, 5, ...]."""
    return torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])


def to_marian(state: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """Marian tensors (separate, contiguous) from a glassformer state dict, in Marian's position layout."""
    perm = halves_permutation(cfg.d_model) if cfg.position_layout == "interleaved" else None

    def stream(name: str, value: Tensor) -> Tensor:
        if perm is None:
            return value
        if any(f".{w}.weight" in name for w in _READS) or name.endswith("token.weight") or name == "head.weight":
            return value[:, perm]
        if any(f".{w}." in name for w in _WRITES) or "layer_norm" in name:
            return value[perm] if value.dim() == 1 else value[perm, :]
        return value

    out = {theirs: stream(ours, state[ours]) for ours, theirs in layer_names(cfg).items()}
    src = stream("src_embed.token.weight", state["src_embed.token.weight"])
    if cfg.share_embeddings:
        out["model.shared.weight"] = src
    out["model.encoder.embed_tokens.weight"] = src
    out["model.decoder.embed_tokens.weight"] = stream("tgt_embed.token.weight", state["tgt_embed.token.weight"])
    out["lm_head.weight"] = stream("head.weight", state["head.weight"])
    bias = state.get("head.bias")
    out["final_logits_bias"] = (bias if bias is not None else torch.zeros(cfg.tgt_vocab)).reshape(1, -1)
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in out.items()}
