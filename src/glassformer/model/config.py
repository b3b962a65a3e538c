"""ModelConfig: the one place where every size and switch of the Transformer lives."""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from .. import limits
from ..errors import UsageError
from ..validation import validate

EARLIER_LAYOUT_FIELDS = ("norm", "extra")   # written by glassformer 0.1's layout (fused projections, `generator`)


@dataclass(frozen=True)
class Limit:
    """A field's bound in glassformer.limits (a constant's name), lifted by --no-limits."""

    name: str


# the field types: pydantic checks the constraints (strictly: no "128" for 128, no true for 1), Limit the limits
Size = Annotated[int, Field(gt=0)]                              # a positive integer
Count = Annotated[int, Field(ge=0)]                             # a non-negative integer
Rate = Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)]   # a probability in [0, 1)
Positive = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]       # a finite positive number
Id = Annotated[int, Field(ge=0)]                                # a token id (below tgt_vocab: checked after)


class ConfigError(UsageError):
    """A model configuration with a wrong type, an unknown key or an out-of-range size (a ValueError)."""


@dataclass
class ModelConfig:
    """Sizes and switches of a glassformer model; defaults follow the 2017 paper (post-norm, sinusoidal)."""

    src_vocab: Annotated[Size, Limit("MAX_VOCAB")] = 1000     # source vocabulary size (encoder embedding rows)
    tgt_vocab: Annotated[Size, Limit("MAX_VOCAB")] = 1000     # target vocabulary size (decoder embedding, logits)
    d_model: Annotated[Size, Limit("MAX_D_MODEL")] = 512      # model width d
    heads: Annotated[Size, Limit("MAX_HEADS")] = 8            # attention heads H
    d_k: Annotated[Size, Limit("MAX_D_FF")] | None = None     # per-head query/key width (default d_model // heads)
    d_v: Annotated[Size, Limit("MAX_D_FF")] | None = None     # per-head value width (default d_model // heads)
    d_ff: Annotated[Size, Limit("MAX_D_FF")] = 2048           # FeedForward inner width
    encoder_layers: Annotated[Count, Limit("MAX_LAYERS")] = 6
    decoder_layers: Annotated[Count, Limit("MAX_LAYERS")] = 6
    dropout: Rate = 0.1            # on every sub-layer output (before the residual) and on embeddings
    attention_dropout: Rate = 0.0  # on attention weights (not in the 2017 paper; off by default)
    norm_placement: Literal["post", "pre"] = "post"   # "post": LN(x + Sub(x)) (2017) | "pre": x + Sub(LN(x))
    final_norm: bool | None = None # LN after each stack; None = only for pre-norm (nn.Transformer: True)
    eps: Positive = 1e-5           # LayerNorm epsilon
    positions: Literal["sinusoidal", "learned", "relative", "rope", "none"] = "sinusoidal"
    max_len: Annotated[Size, Limit("MAX_LEN")] = 256          # longest sequence the position scheme accepts
    relative_clip: Annotated[Count, Limit("MAX_LEN")] = 16    # relative bias: offsets clipped to [-clip, clip]
    rope_base: Positive = 10000.0  # RoPE frequency base
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model) (2017)
    scale_scores: bool = True      # divide scores by sqrt(d_k) before the softmax (2017)
    position_layout: Literal["interleaved", "halves"] = "interleaved"  # sin/cos interleaved (2017) | halves (Marian)
    activation: Literal["relu", "silu"] = "relu"   # FeedForward non-linearity: relu (2017) | silu ("swish", OPUS-MT)
    bias: bool = True              # biases in the linear projections
    head_bias: bool = False        # a bias on the vocabulary head (Marian's final_logits_bias)
    tie_target: bool = True        # target embedding shares its matrix with the vocabulary head
    share_embeddings: bool = False # source and target embeddings are one matrix (needs src_vocab == tgt_vocab)
    family: Literal["encoder-decoder", "encoder-only", "decoder-only"] = "encoder-decoder"
    attention_path: Literal["fast", "glass"] = "fast"   # fast: fused SDPA | glass: explicit math, every intermediate
    pad_id: Id = 0                 # token id of PAD (used when padding flags are not given)
    bos_id: Id = 1                 # the decoder's first input (Marian: its PAD id)
    eos_id: Id = 2                 # the token that ends a translation

    def __post_init__(self) -> None:
        if isinstance(self.heads, int) and self.heads > 0 and isinstance(self.d_model, int):
            self.d_k = self.d_model // self.heads if self.d_k is None else self.d_k
            self.d_v = self.d_model // self.heads if self.d_v is None else self.d_v
        _check_fields(self)
        _check_relations(self)
        _check_limits(self)

    @property
    def use_final_norm(self) -> bool:
        """Whether each stack ends with its own LayerNorm (always for pre-norm)."""
        return self.norm_placement == "pre" if self.final_norm is None else bool(self.final_norm)

    def replace(self, **changes) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict, source: str = "ModelConfig") -> ModelConfig:
        """Build from a JSON dict; a wrong type, an unknown key or a size over a limit is a ConfigError
        (a ValueError) naming `source` and the field."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected an object of model settings, got {type(data).__name__}")
        earlier = [k for k in EARLIER_LAYOUT_FIELDS if k in data]
        if earlier:
            raise ConfigError(f"{source}: written by an earlier glassformer layout (field {earlier[0]!r}), which this "
                              "version no longer reads; train the model again with `glassformer train --out DIR`",
                              earlier[0])
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known, key=str)
        if unknown:
            raise ConfigError(f"{source}: unknown field {unknown[0]!r}", str(unknown[0]))
        try:
            return cls(**data)
        except ConfigError as error:
            raise ConfigError(f"{source}: {str(error).removeprefix('ModelConfig.')}", error.field) from None
        except ValueError as error:
            raise ConfigError(f"{source}: {str(error).removeprefix('ModelConfig.')}") from None

    # ---- presets -------------------------------------------------------------------------
    @classmethod
    def base(cls, **changes) -> ModelConfig:
        """The 2017 base model: 6+6 layers, d 512, 8 heads (d_k = d_v = 64), d_ff 2048 (claim D7)."""
        return cls(**{**dict(d_model=512, heads=8, d_ff=2048, encoder_layers=6, decoder_layers=6,
                             dropout=0.1), **changes})

    @classmethod
    def tiny(cls, **changes) -> ModelConfig:
        """A small model for tests and quick experiments: 2+2 layers, d 32, 4 heads, d_ff 64."""
        return cls(**{**dict(d_model=32, heads=4, d_ff=64, encoder_layers=2, decoder_layers=2,
                             dropout=0.0, max_len=64), **changes})


PRESETS = {"base": ModelConfig.base, "tiny": ModelConfig.tiny}


# ---- checks: each field by its declaration, then what relates fields, then the limits -------------------
@functools.cache
def _field_types() -> dict[str, object]:
    return typing.get_type_hints(ModelConfig, include_extras=True)


def _check_fields(cfg: ModelConfig) -> None:
    """Every field has its declared type and constraints; a ConfigError names the first field that does not."""
    for name, hint in _field_types().items():
        try:
            validate(hint, getattr(cfg, name), f"ModelConfig.{name}", error_type=ConfigError)
        except ConfigError as error:
            raise ConfigError(str(error), name) from None


def _check_relations(cfg: ModelConfig) -> None:
    """The rules that tie fields together."""
    if cfg.positions == "rope" and cfg.d_k % 2:
        raise ConfigError(f"ModelConfig.d_k must be even for rope positions, got {cfg.d_k}", "d_k")
    for name in ("pad_id", "bos_id", "eos_id"):
        if getattr(cfg, name) >= cfg.tgt_vocab:
            raise ConfigError(f"ModelConfig.{name} must be a token id in [0, tgt_vocab={cfg.tgt_vocab}), "
                              f"got {getattr(cfg, name)}", name)
    if cfg.share_embeddings and cfg.src_vocab != cfg.tgt_vocab:
        raise ConfigError(f"ModelConfig.share_embeddings needs src_vocab == tgt_vocab, got {cfg.src_vocab} and "
                          f"{cfg.tgt_vocab}", "share_embeddings")
    if cfg.family == "encoder-decoder" and (cfg.encoder_layers == 0 or cfg.decoder_layers == 0):
        raise ConfigError("ModelConfig.encoder_layers and decoder_layers must be >= 1 for encoder-decoder",
                          "encoder_layers")


def parameter_count(cfg: ModelConfig) -> int:
    """Parameters the model of `cfg` has, counted from the sizes (a matrix shared by tying counts once).

    Per attention block: W^Q, W^K (d x H d_k), W^V (d x H d_v), W^O (H d_v x d); per FeedForward
    W_1 (d x d_ff), W_2 (d_ff x d); a LayerNorm has a gain and a bias of width d.
    """
    d, heads, bias = cfg.d_model, cfg.heads, cfg.bias
    qk, v = heads * cfg.d_k, heads * cfg.d_v
    attention = 2 * d * qk + d * v + v * d + ((2 * qk + v + d) if bias else 0)
    feed_forward = 2 * d * cfg.d_ff + ((cfg.d_ff + d) if bias else 0)
    norm = 2 * d
    relative = heads * (2 * cfg.relative_clip + 1) if cfg.positions == "relative" else 0   # self-attention's b_{i-j}
    learned = cfg.max_len * d if cfg.positions == "learned" else 0          # per embedding layer
    final = norm if cfg.use_final_norm else 0                                # per stack
    encoder = cfg.encoder_layers * (attention + relative + feed_forward + 2 * norm) + final
    if cfg.family == "encoder-only":                                         # head tied to the embedding
        return cfg.src_vocab * d + learned + encoder
    if cfg.family == "decoder-only":
        causal = cfg.decoder_layers * (attention + relative + feed_forward + 2 * norm) + final
        return cfg.tgt_vocab * d + learned + causal
    decoder = cfg.decoder_layers * (2 * attention + relative + feed_forward + 3 * norm) + final
    source_table = cfg.src_vocab * d
    target_table = 0 if cfg.share_embeddings else cfg.tgt_vocab * d
    head = (0 if cfg.tie_target else d * cfg.tgt_vocab) + (cfg.tgt_vocab if cfg.head_bias else 0)
    return source_table + target_table + 2 * learned + encoder + decoder + head


def _check_limits(cfg: ModelConfig) -> None:
    """Each field's Limit (lifted by --no-limits), then the whole model's parameter count (MAX_PARAMETERS)."""
    try:
        for name, hint in _field_types().items():
            for bound in _limits_of(hint):
                limits.check(f"ModelConfig.{name}", getattr(cfg, name), bound.name, name)
        limits.check("ModelConfig: parameters", parameter_count(cfg), "MAX_PARAMETERS")
    except limits.LimitError as error:
        raise ConfigError(str(error), error.field) from None


def _limits_of(hint: object) -> list[Limit]:
    """The Limit markers in a field's annotation (also inside `... | None`)."""
    found = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Limit)]
    for arg in typing.get_args(hint):
        found += _limits_of(arg) if arg is not type(None) else []
    return found
