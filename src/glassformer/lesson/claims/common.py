"""Material the chapters share: tolerances, the seeded models, the lesson's ids, and small comparisons."""

from __future__ import annotations

import fnmatch
import math

import numpy as np
import torch

from ...model.config import ModelConfig
from ...model.hooks import Recording
from ...model.layers import EncoderLayer
from ...model.transformer import Transformer
from .. import examples as ex
from ..spec import run_spec
from ..views import source_ids, target_ids
from .registry import injected

__all__ = ["EXACT", "TABLE", "TOL", "array", "block", "diff", "layer", "np_softmax", "probes", "rows",
           "seeded_model", "source_ids", "target_ids"]

TOL = ex.LESSON_DECIMALS_TOLERANCE   # a number printed to six decimals
EXACT = 1e-10                         # float64 agreement between two computations of the same thing
TABLE = 1e-7                          # the model keeps its sinusoidal table in float32 (rounding 3e-8)


def array(value) -> np.ndarray:
    return np.array(value, dtype=np.float64)


def seeded_model(seed: int = 0, **changes) -> Transformer:
    """A seeded, untrained tiny encoder–decoder over the lesson's vocabularies, float64, glass path."""
    cfg = ModelConfig.tiny(src_vocab=len(ex.SOURCE_VOCAB), tgt_vocab=len(ex.TARGET_VOCAB),
                           attention_path="glass", **changes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Transformer(cfg)
    return injected(model.double().eval())


def layer(seed: int = 0, **changes) -> EncoderLayer:
    """A seeded tiny encoder layer, float64."""
    cfg = ModelConfig.tiny(attention_path="glass", **changes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        built = EncoderLayer(cfg)
    return injected(built.double().eval())


def rows(seed: int, *shape: int) -> torch.Tensor:
    """Standard-normal float64 rows from a NumPy seed (independent of torch's RNG)."""
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape))


def block(**changes) -> dict:
    """The lesson's BLOCK through trace spec v1, with some fields changed (and the running check's hooks)."""
    return run_spec({**ex.block_spec(), **changes}, attach=injected)


def np_softmax(s: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(s - s.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def diff(a, b) -> float:
    """max |a − b| (inf when the shapes differ)."""
    a = a.detach().numpy() if isinstance(a, torch.Tensor) else np.asarray(a, dtype=np.float64)
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b))) if a.shape == b.shape else math.inf


def probes(trace: Recording, pattern: str) -> list[torch.Tensor]:
    """The recorded tensors whose names match `pattern`, in recording order."""
    return [t for name, t in trace.records.items() if fnmatch.fnmatchcase(name, pattern)]
