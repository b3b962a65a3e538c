"""model: the Transformer itself, written as the lesson reads — config -> masks/positions/hooks -> attention ->
layers -> transformer; readout reads the vocabulary head row by row. Knows nothing above it: imports only the
base modules (errors, limits, validation)."""

from .attention import CrossAttention, MultiHeadAttention, SelfAttention, attend_math, attend_sdpa
from .cache import KVCache
from .config import PRESETS, ModelConfig
from .hooks import HookPoint, Recording, hook_names, intervene, probes
from .layers import DecoderLayer, EncoderLayer, FeedForward, ResidualNorm
from .masks import causal_mask, combine, loss_mask, padding_mask
from .positions import LearnedPositions, RelativePositionBias, RotaryEmbedding, sinusoidal_positions
from .transformer import Decoder, DecoderOnlyModel, Encoder, EncoderOnlyModel, Transformer, build_model

__all__ = [
    "CrossAttention", "KVCache", "MultiHeadAttention", "SelfAttention", "attend_math", "attend_sdpa", "PRESETS",
    "ModelConfig", "HookPoint", "Recording", "hook_names", "intervene", "probes", "DecoderLayer", "EncoderLayer",
    "FeedForward", "ResidualNorm", "causal_mask", "combine", "loss_mask", "padding_mask",
    "LearnedPositions", "RelativePositionBias", "RotaryEmbedding", "sinusoidal_positions", "Decoder",
    "DecoderOnlyModel", "Encoder", "EncoderOnlyModel", "Transformer", "build_model",
]
