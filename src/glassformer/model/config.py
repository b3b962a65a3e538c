"""ModelConfig: the one place where every size and switch of the Transformer lives."""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass

from pydantic import Field

from .. import limits
from ..errors import UsageError
from ..validation import validate

NORMS = ("post", "pre")
ACTIVATIONS = ("relu", "silu")
POSITION_LAYOUTS = ("interleaved", "halves")
POSITIONS = ("sinusoidal", "learned", "relative", "rope", "none")
FAMILIES = ("encoder-decoder", "encoder-only", "decoder-only")
ATTENTION_PATHS = ("fast", "glass")
EARLIER_LAYOUT_FIELDS = ("norm", "extra")   # written by glassformer 0.1's layout (fused projections, `generator`)


class ConfigError(UsageError):
    """A model configuration with a wrong type, an unknown key or an out-of-range size (a ValueError)."""


@dataclass
class ModelConfig:
    """Sizes and switches of a glassformer model; defaults follow the 2017 paper (post-norm, sinusoidal)."""

    src_vocab: int = 1000          # source vocabulary size (encoder embedding rows)
    tgt_vocab: int = 1000          # target vocabulary size (decoder embedding rows, logits)
    d_model: int = 512             # model width d
    heads: int = 8                 # attention heads H
    d_k: int | None = None         # per-head query/key width (default d_model // heads)
    d_v: int | None = None         # per-head value width (default d_model // heads)
    d_ff: int = 2048               # FeedForward inner width
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.1           # on every sub-layer output (before the residual) and on embeddings
    attention_dropout: float = 0.0 # on attention weights (not in the 2017 paper; off by default)
    norm_placement: str = "post"   # "post": LN(x + Sub(x)) (2017) | "pre": x + Sub(LN(x))
    final_norm: bool | None = None # LN after each stack; None = only for pre-norm (nn.Transformer: True)
    eps: float = 1e-5              # LayerNorm epsilon
    positions: str = "sinusoidal"  # sinusoidal | learned | relative | rope | none
    max_len: int = 256             # longest sequence the position scheme accepts
    relative_clip: int = 16        # relative bias: offsets clipped to [-clip, clip]
    rope_base: float = 10000.0     # RoPE frequency base
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model) (2017)
    scale_scores: bool = True      # divide scores by sqrt(d_k) before the softmax (2017)
    position_layout: str = "interleaved"  # sinusoidal channels: sin/cos interleaved (2017) | halves (Marian)
    activation: str = "relu"       # FeedForward non-linearity: relu (2017) | silu ("swish", OPUS-MT)
    bias: bool = True              # biases in the linear projections
    head_bias: bool = False        # a bias on the vocabulary head (Marian's final_logits_bias)
    tie_target: bool = True        # target embedding shares its matrix with the vocabulary head
    share_embeddings: bool = False # source and target embeddings are one matrix (needs src_vocab == tgt_vocab)
    family: str = "encoder-decoder"
    attention_path: str = "fast"   # fast: fused SDPA | glass: explicit math, every intermediate
    pad_id: int = 0                # token id of PAD (used when padding flags are not given)
    bos_id: int = 1                # the decoder's first input (Marian: its PAD id)
    eos_id: int = 2                # the token that ends a translation

    def __post_init__(self) -> None:
        _check_types(self)
        if self.d_k is None:
            self.d_k = self.d_model // self.heads if self.heads > 0 else 0
        if self.d_v is None:
            self.d_v = self.d_model // self.heads if self.heads > 0 else 0
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the offending field when a size or switch is out of range."""
        positive = ("src_vocab", "tgt_vocab", "d_model", "heads", "d_k", "d_v", "d_ff", "max_len")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}")
        for name in ("encoder_layers", "decoder_layers", "relative_clip"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"ModelConfig.{name} must be a non-negative integer, got {value!r}")
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if not 0.0 <= float(value) < 1.0:
                raise ValueError(f"ModelConfig.{name} must be in [0, 1), got {value!r}")
        if not self.eps > 0:
            raise ValueError(f"ModelConfig.eps must be positive, got {self.eps!r}")
        choices = {"norm_placement": NORMS, "positions": POSITIONS, "family": FAMILIES,
                   "attention_path": ATTENTION_PATHS, "activation": ACTIVATIONS, "position_layout": POSITION_LAYOUTS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"ModelConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.positions == "rope" and self.d_k % 2:
            raise ValueError(f"ModelConfig.d_k must be even for rope positions, got {self.d_k}")
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if not 0 <= value < self.tgt_vocab:
                raise ValueError(f"ModelConfig.{name} must be a token id in [0, tgt_vocab={self.tgt_vocab}), "
                                 f"got {value}")
        if self.share_embeddings and self.src_vocab != self.tgt_vocab:
            raise ValueError(f"ModelConfig.share_embeddings needs src_vocab == tgt_vocab, got {self.src_vocab} and "
                             f"{self.tgt_vocab}")
        if self.family == "encoder-decoder" and (self.encoder_layers == 0 or self.decoder_layers == 0):
            raise ValueError("ModelConfig.encoder_layers and decoder_layers must be >= 1 for encoder-decoder")
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


# ---- checks through glassformer.validation and glassformer.limits --------------------------------
_FINITE = typing.Annotated[float, Field(allow_inf_nan=False)]


@functools.cache
def _field_types() -> dict[str, object]:
    """Each field's declared type (floats must be finite) for the validation layer."""
    hints = typing.get_type_hints(ModelConfig)
    return {name: (_FINITE if hint is float else hint) for name, hint in hints.items()}


def _check_types(cfg: ModelConfig) -> None:
    """Every field has its declared type (no "128" for 128, no true for 1, no "x" for a number)."""
    for name, hint in _field_types().items():
        try:
            validate(hint, getattr(cfg, name), f"ModelConfig.{name}", error_type=ConfigError)
        except ConfigError as error:
            raise ConfigError(str(error), name) from None


_SIZE_LIMITS = {"d_model": "MAX_D_MODEL", "heads": "MAX_HEADS", "d_k": "MAX_D_FF", "d_v": "MAX_D_FF",
                "d_ff": "MAX_D_FF", "encoder_layers": "MAX_LAYERS", "decoder_layers": "MAX_LAYERS",
                "max_len": "MAX_LEN", "relative_clip": "MAX_LEN", "src_vocab": "MAX_VOCAB", "tgt_vocab": "MAX_VOCAB"}


def parameter_count(cfg: ModelConfig) -> int:
    """Parameters the model of `cfg` has: built on the meta device (shapes only, nothing allocated)."""
    import torch

    from .transformer import build_model

    with torch.device("meta"):
        model = build_model(cfg)
    return sum(p.numel() for p in model.parameters())                         # tied matrices count once


def _check_limits(cfg: ModelConfig) -> None:
    """Sizes within glassformer.limits (lifted by --no-limits), then the whole model's parameter count."""
    try:
        for name, limit in _SIZE_LIMITS.items():
            limits.check(f"ModelConfig.{name}", getattr(cfg, name), limit, name)
        limits.check("ModelConfig: parameters", parameter_count(cfg), "MAX_PARAMETERS")
    except limits.LimitError as error:
        raise ConfigError(str(error), error.field) from None
