"""The Transformer itself: config -> masks/positions -> attention -> layers -> transformer; trace observes."""

from .attention import KVCache, MultiHeadAttention
from .config import PRESETS, ModelConfig
from .layers import DecoderLayer, EncoderLayer, FeedForward, LayerCache, ResidualNorm
from .masks import causal_mask, combine, loss_mask, padding_mask
from .positions import LearnedPositions, RelativePositionBias, RotaryEmbedding, sinusoidal_positions
from .trace import Trace
from .transformer import (
                          Decoder,
                          DecoderCache,
                          DecoderOnlyModel,
                          Encoder,
                          EncoderOnlyModel,
                          Transformer,
                          build_model,
)

__all__ = [
    "KVCache", "MultiHeadAttention", "PRESETS", "ModelConfig", "DecoderLayer", "EncoderLayer", "FeedForward",
    "LayerCache", "ResidualNorm", "causal_mask", "combine", "loss_mask", "padding_mask", "LearnedPositions",
    "RelativePositionBias", "RotaryEmbedding", "sinusoidal_positions", "Trace", "Decoder", "DecoderCache",
    "DecoderOnlyModel", "Encoder", "EncoderOnlyModel", "Transformer", "build_model",
]
