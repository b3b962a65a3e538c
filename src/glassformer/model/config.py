"""ModelConfig: the one place where every size and switch of the Transformer lives."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

NORMS = ("post", "pre")
POSITIONS = ("sinusoidal", "learned", "relative", "rope", "none")
FAMILIES = ("encoder-decoder", "encoder-only", "decoder-only")
ATTENTION_PATHS = ("fast", "glass")


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
    norm: str = "post"             # "post": LN(x + Sub(x)) (2017) | "pre": x + Sub(LN(x))
    final_norm: bool | None = None # LN after each stack; None = only for pre-norm (nn.Transformer: True)
    eps: float = 1e-5              # LayerNorm epsilon
    positions: str = "sinusoidal"  # sinusoidal | learned | relative | rope | none
    max_len: int = 256             # longest sequence the position scheme accepts
    relative_clip: int = 16        # relative bias: offsets clipped to [-clip, clip]
    rope_base: float = 10000.0     # RoPE frequency base
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model) (2017)
    scale_scores: bool = True      # divide scores by sqrt(d_k) before the softmax (2017)
    bias: bool = True              # biases in the linear projections
    tie_target: bool = True        # target embedding shares its matrix with the output layer
    family: str = "encoder-decoder"
    attention_path: str = "fast"   # fast: fused SDPA | glass: explicit math, every intermediate
    pad_id: int = 0                # token id of PAD (used when padding flags are not given)

    def __post_init__(self) -> None:
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
        choices = {"norm": NORMS, "positions": POSITIONS, "family": FAMILIES,
                   "attention_path": ATTENTION_PATHS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"ModelConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.positions == "rope" and self.d_k % 2:
            raise ValueError(f"ModelConfig.d_k must be even for rope positions, got {self.d_k}")
        if self.family == "encoder-decoder" and (self.encoder_layers == 0 or self.decoder_layers == 0):
            raise ValueError("ModelConfig.encoder_layers and decoder_layers must be >= 1 for encoder-decoder")

    @property
    def use_final_norm(self) -> bool:
        """Whether each stack ends with its own LayerNorm (always for pre-norm)."""
        return self.norm == "pre" if self.final_norm is None else bool(self.final_norm)

    def replace(self, **changes) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        """Build from a JSON dict; unknown keys are an error naming the key."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"ModelConfig: unknown field {unknown[0]!r}")
        return cls(**data)

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
