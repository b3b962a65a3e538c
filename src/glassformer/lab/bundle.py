"""The model bundle: a run folder's config, vocabularies and weights as one JSON object for the page's engine
(lab/static/engine/weights.js reads it).

    {"format": "glassformer-bundle/1", "config": ModelConfig dict, "vocab": vocab.json ({source, target}),
     "dtype": "float32" | "float16", "tensors": {name: {"shape", "offset", "length"}}, "data": base64}

`data` holds every tensor's little-endian bytes, one after the other; `offset` and `length` are bytes.
Names are the model's state_dict names (nn.Linear weights (out, in)); a matrix shared by tying
(`head.weight` with `tgt_embed.token.weight`, or both embeddings) is written once, under its first name,
and the engine takes it from the config. float16 halves the file; it is refused when a weight does not fit
its range. `read_bundle` is the checking reader (sizes before any allocation, one line per problem).
"""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import limits
from ..errors import UsageError
from ..model import ModelConfig

FORMAT = "glassformer-bundle/1"
DTYPES = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2")}
MAX_TENSORS = 10_000                 # tensors in one bundle (the engine's MAX_BUNDLE_TENSORS)
MAX_RANK = 4                         # axes of one tensor


class BundleError(UsageError):
    """A model bundle that cannot be read: one line naming what is wrong."""


def _parts(run_dir_or_model, tokenizers) -> tuple[Any, dict]:
    """(model, vocab dict) from a run folder, or from a model and its tokenizers / vocab dict."""
    if isinstance(run_dir_or_model, (str, Path)):
        from ..data.checkpoint import VOCAB, find_run_root, load_translator_parts, read_run_json

        model, source, target, _ = load_translator_parts(run_dir_or_model)
        if tokenizers is None:
            vocab = read_run_json(find_run_root(run_dir_or_model) / VOCAB, "MAX_VOCAB_BYTES")
            return model, {"source": vocab["source"], "target": vocab["target"]}
        run_dir_or_model = model
    model = run_dir_or_model
    if isinstance(tokenizers, dict):
        return model, {"source": tokenizers["source"], "target": tokenizers["target"]}
    if tokenizers is None:
        raise BundleError("write_bundle: a model needs its tokenizers (source, target) or a vocab dict")
    source, target = tokenizers
    return model, {"source": source.to_dict(), "target": target.to_dict()}


def unique_tensors(model) -> dict[str, torch.Tensor]:
    """The state_dict with each shared (tied) matrix once, under its first name."""
    seen: set[int] = set()
    out = {}
    for name, tensor in model.state_dict().items():
        key = tensor.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor
    return out


def write_bundle(run_dir_or_model, tokenizers=None, dtype: str = "float32") -> dict:
    """The bundle of a run folder (path) or of a model with its tokenizers ((source, target) or a vocab dict)."""
    if dtype not in DTYPES:
        raise BundleError(f"dtype: expected float32 or float16, got {dtype!r}")
    model, vocab = _parts(run_dir_or_model, tokenizers)
    if getattr(model.cfg, "family", "encoder-decoder") != "encoder-decoder":
        raise BundleError(f"the page's engine runs encoder-decoder models, not {model.cfg.family}")
    tensors, chunks, offset = {}, [], 0
    for name, tensor in unique_tensors(model).items():
        values = tensor.detach().cpu().double().numpy()
        if dtype == "float16" and np.abs(values).max(initial=0.0) > np.finfo(np.float16).max:
            raise BundleError(f"dtype float16: tensor {name} has a weight beyond float16's range; use float32")
        raw = np.ascontiguousarray(values.astype(DTYPES[dtype])).tobytes()
        tensors[name] = {"shape": list(values.shape), "offset": offset, "length": len(raw)}
        chunks.append(raw)
        offset += len(raw)
    return {"format": FORMAT, "config": model.cfg.to_dict(), "vocab": vocab, "dtype": dtype, "tensors": tensors,
            "data": base64.b64encode(b"".join(chunks)).decode("ascii")}


def _damaged(detail: str) -> BundleError:
    return BundleError(f"model bundle: {detail} (the file is damaged or not a glassformer model bundle)")


def read_bundle(bundle: Any) -> tuple[ModelConfig, dict, dict[str, np.ndarray]]:
    """Check a parsed bundle and read it: (config, vocab, name -> float64 array). Every size is checked
    against the header and glassformer.limits before the weights are decoded; a problem is one BundleError."""
    if not isinstance(bundle, dict):
        raise _damaged("expected a JSON object")
    if bundle.get("format") != FORMAT:
        raise _damaged(f"format: expected {FORMAT!r}, got {str(bundle.get('format'))[:60]!r}")
    for key, kind in (("config", dict), ("vocab", dict), ("tensors", dict), ("data", str)):
        if not isinstance(bundle.get(key), kind):
            raise _damaged(f"{key}: expected {'an object' if kind is dict else 'a base64 string'}")
    dtype = bundle.get("dtype")
    if dtype not in DTYPES:
        raise _damaged(f"dtype: expected float32 or float16, got {str(dtype)[:40]!r}")
    try:
        cfg = ModelConfig.from_dict(bundle["config"], "model bundle: config")   # sizes within the limits
    except UsageError as error:
        raise BundleError(str(error)) from None
    size = len(bundle["data"]) * 3 // 4
    limits.check("model bundle: bytes of weights", size, "MAX_WEIGHTS_BYTES")
    tensors = bundle["tensors"]
    if not 0 < len(tensors) <= MAX_TENSORS:
        raise _damaged(f"tensors: {len(tensors)} entries (1..{MAX_TENSORS} expected)")
    width = DTYPES[dtype].itemsize
    for name, t in tensors.items():
        shape = t.get("shape") if isinstance(t, dict) else None
        if (not isinstance(shape, list) or len(shape) > MAX_RANK
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
            raise _damaged(f"tensor {name}: expected {{shape, offset, length}}")
        offset, length = t.get("offset"), t.get("length")
        if (not isinstance(offset, int) or not isinstance(length, int) or offset < 0
                or length != int(np.prod(shape, dtype=np.int64)) * width or offset + length > size):
            raise _damaged(f"tensor {name}: bytes {offset}..{offset}+{length} of shape {shape} do not fit the "
                           f"{size} bytes of data")
    try:
        data = base64.b64decode(bundle["data"], validate=True)
    except (binascii.Error, ValueError):
        raise _damaged("data: not base64 text") from None
    out = {}
    for name, t in tensors.items():
        values = np.frombuffer(data, DTYPES[dtype], int(np.prod(t["shape"], dtype=np.int64)), t["offset"])
        values = values.astype(np.float64).reshape(t["shape"])
        if not np.isfinite(values).all():
            raise _damaged(f"tensor {name}: a non-finite weight")
        out[name] = values
    return cfg, bundle["vocab"], out


def bundle_json(bundle: dict) -> str:
    """The bundle as compact JSON text (what a page embeds)."""
    return json.dumps(bundle, ensure_ascii=False, separators=(",", ":"))
