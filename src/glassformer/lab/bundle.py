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


# ---- the offline file's weights: byte planes, deflated, seven bits a character ------------------------------------
# The exported page (lab/export.py) carries a bundle's weights losslessly in about 0.84 x 8/7 of their bytes instead
# of base64's 4/3: each tensor byte's place in its float (sign and exponent, then the mantissa bytes) becomes a plane
# of its own, so the exponents sit together and deflate (zlib, with its Adler-32 check) shrinks them; the deflated
# bytes are then written seven bits a character. A 7-bit value that HTML script text cannot hold as it is (NUL and
# CR, which the parser rewrites, and "<", which could end the element) is written with the next 7-bit value as one
# two-byte character U+0100 + 128·k + next (k: its place in PACK_ESCAPED; k + 3 for the last value, alone). The page
# decodes it (static/pack.js: the browser's own DecompressionStream) back into the float bytes of the bundle.
PACK_FORMAT = "planes-zlib-text7"
PACK_ESCAPED = (0x00, 0x0D, 0x3C)
PACK_ESCAPE_BASE = 0x100


def pack_weights(raw: bytes, width: int) -> tuple[str, dict]:
    """`raw` (little-endian values of `width` bytes) as text for a script element, and what the page needs to
    read it: {"format", "width", "bytes", "deflated"}."""
    import zlib

    if width < 1 or len(raw) % width:
        raise BundleError(f"pack_weights: {len(raw)} bytes are not values of {width} bytes")
    planes = np.frombuffer(raw, np.uint8).reshape(-1, width).T.tobytes()        # (width, values): plane after plane
    deflated = zlib.compress(planes, 6)
    bits = np.unpackbits(np.frombuffer(deflated, np.uint8))
    bits = np.concatenate([bits, np.zeros(-len(bits) % 7, np.uint8)]).reshape(-1, 7)
    values = np.zeros(len(bits), np.uint32)                                    # 7-bit values, most significant first
    for j in range(7):
        values |= bits[:, j].astype(np.uint32) << (6 - j)
    escaped = {v: k for k, v in enumerate(PACK_ESCAPED)}
    out = values.copy()
    keep = np.ones(len(values), bool)
    candidates = np.flatnonzero(np.isin(values, PACK_ESCAPED))
    skip = -1
    for i in candidates.tolist():                             # left to right: a pair eats the next value
        if i <= skip:
            continue
        k = escaped[int(values[i])]
        if i + 1 < len(values):
            out[i] = PACK_ESCAPE_BASE + 128 * k + int(values[i + 1])
            keep[i + 1] = False
            skip = i + 1
        else:
            out[i] = PACK_ESCAPE_BASE + 128 * (k + 3)
    text = out[keep].astype("<u4").tobytes().decode("utf-32-le")
    return text, {"format": PACK_FORMAT, "width": width, "bytes": len(raw), "deflated": len(deflated)}


def unpack_weights(text: str, info: dict) -> bytes:
    """pack_weights' bytes back from its text (the page's static/pack.js reads it the same way)."""
    import zlib

    codes = np.frombuffer(text.encode("utf-32-le"), "<u4")
    values = []
    for c in codes.tolist():
        if c < 0x80:
            values.append(c)
            continue
        k, rest = divmod(c - PACK_ESCAPE_BASE, 128)
        if not 0 <= k < 2 * len(PACK_ESCAPED):
            raise _damaged(f"weights: character U+{c:04X}")
        if k < len(PACK_ESCAPED):
            values += [PACK_ESCAPED[k], rest]
        else:
            values.append(PACK_ESCAPED[k - len(PACK_ESCAPED)])               # the last value, alone
    bits = ((np.array(values, np.uint8)[:, None] >> np.arange(6, -1, -1)) & 1).astype(np.uint8).ravel()
    deflated = np.packbits(bits[: 8 * info["deflated"]]).tobytes()
    try:
        planes = zlib.decompress(deflated)
    except zlib.error as error:
        raise _damaged(f"weights: {error}") from None
    width = info["width"]
    if len(planes) != info["bytes"]:
        raise _damaged(f"weights: {len(planes)} bytes, expected {info['bytes']}")
    return np.frombuffer(planes, np.uint8).reshape(width, -1).T.tobytes()
