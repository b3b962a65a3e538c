"""`glassformer import HF_DIR --out RUN_DIR`: a Hugging Face Marian folder (OPUS-MT) as a glassformer run folder.

Read: config.json (every size checked against glassformer.limits before anything is allocated),
model.safetensors (its header's shapes checked first) or pytorch_model.bin (only through
`torch.load(weights_only=True)`: a pickle that asks for anything but tensors is refused), source.spm,
target.spm, vocab.json (+ target_vocab.json for separate vocabularies), generation_config.json when
present. Written: an ordinary run folder (config.json with the model's origin, vocab.json naming the
SentencePiece models, source.spm, target.spm, model.safetensors) that every command loads unchanged.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from .. import limits
from ..data.checkpoint import CONFIG, MODEL, VOCAB, read_run_json, save_weights, weight_shapes, write_json
from ..data.sentencepiece import PAD_TOKEN, PieceVocab, SentencePieceSource, SentencePieceTarget, load_processor
from ..errors import UsageError
from ..model import ModelConfig, Transformer
from . import marian
from .export import staged_folder

FORMAT = "Hugging Face Marian"


def _missing(path: Path) -> str:
    """Why `path`, which is not a regular file, cannot be read: missing, or there as something else."""
    if os.path.lexists(path) and not path.exists():
        return "a link to nothing (or a loop of links)"
    if path.exists():
        return "not a regular file (a folder, a FIFO or a device)"
    return "missing"


def _json(path: Path, limit: str, required: bool = True) -> Any:
    if not path.is_file():
        if required or path.exists() or os.path.lexists(path):
            raise UsageError(f"{path}: {_missing(path)} (a Marian folder has config.json, model.safetensors or "
                             "pytorch_model.bin, source.spm, target.spm and vocab.json)")
        return None
    return read_run_json(path, limit)


def read_tensors(folder: Path, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The folder's tensors by Marian name, shapes checked against `cfg` before any tensor is read."""
    expected = marian.hf_shapes(cfg)
    st, pt = folder / "model.safetensors", folder / "pytorch_model.bin"
    path = st if st.is_file() or os.path.lexists(st) else pt
    if not path.is_file():
        if os.path.lexists(path):
            raise UsageError(f"{path}: {_missing(path)}")
        raise UsageError(f"{folder}: no model.safetensors or pytorch_model.bin")
    limits.check(f"{path}: size in bytes", path.stat().st_size, "MAX_WEIGHTS_BYTES")
    if path == st:
        shapes = weight_shapes(path)
        _check_shapes(path, shapes, expected)
        with safe_open(str(path), framework="pt") as f:
            return _floats(path, {name: f.get_tensor(name) for name in shapes})
    try:
        with warnings.catch_warnings(record=True):   # torch's notes on the file (pickle protocol): not printed
            try:
                loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as error:              # a file of the legacy (non-zip) format cannot be mapped
                if "mmap" not in str(error):
                    raise
                loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # UnpicklingError for a pickle that asks for more than tensors, RuntimeError, EOFError
        raise UsageError(f"{path}: refused: not a weights-only PyTorch file ({_load_error(error)})") from None
    if not isinstance(loaded, dict) or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in loaded.items()):
        raise UsageError(f"{path}: refused: expected a dict of named tensors, got {type(loaded).__name__}")
    _check_shapes(path, {k: tuple(v.shape) for k, v in loaded.items()}, expected)
    return _floats(path, loaded)


def _load_error(error: Exception) -> str:
    """The reason in torch.load's message: the weights-only unpickler's own line (which global the file asks
    for), else the first line, printable and short."""
    text = str(error).strip()
    mark, lines = "WeightsUnpickler error:", []
    for line in text.splitlines()[1 if text.startswith("Weights only load failed") else 0:]:   # torch's preamble
        line = line.split(mark, 1)[-1].strip()
        if line and not line.startswith(("Check the documentation", "Please file an issue")):
            lines.append(line)
    reason = lines[0] if lines else type(error).__name__
    return "".join(c if c.isprintable() else "?" for c in reason)[:160]


FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_shapes(path: Path, found: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]]) -> None:
    """Every tensor of the file is one config.json implies, of its shape: a tensor it does not (a layer more than
    config.json counts, a part this architecture has not) would be dropped, and the model run without it."""
    for name, shape in found.items():
        if name not in expected:
            raise UsageError(f"{path}: tensor {name} is not part of the Marian model config.json describes "
                             f"({len(found)} tensors in the file)")
        if tuple(shape) != expected[name]:
            raise UsageError(f"{path}: tensor {name} has shape {list(shape)}; config.json implies "
                             f"{list(expected[name])}")


def _floats(path: Path, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors`, each a floating-point one (weights stored as integers or booleans are not a Marian model's)."""
    for name, t in tensors.items():
        if t.dtype not in FLOATS:
            raise UsageError(f"{path}: tensor {name} is {str(t.dtype).removeprefix('torch.')}; weights are "
                             "float16, bfloat16, float32 or float64")
    return tensors


def read_vocab(path: Path) -> dict[str, int]:
    data = _json(path, "MAX_VOCAB_BYTES")
    if not isinstance(data, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in data.values()):
        raise UsageError(f"{path}: expected an object mapping pieces to integer ids")
    limits.check(f"{path}: entries", len(data), "MAX_VOCAB")
    return data


def read_tokenizers(folder: Path, cfg: ModelConfig) -> tuple[SentencePieceSource, SentencePieceTarget]:
    """Source and target tokenizers as MarianTokenizer builds them from the folder's files."""
    for name in ("source.spm", "target.spm", "vocab.json"):
        if not (folder / name).is_file():
            raise UsageError(f"{folder / name}: {_missing(folder / name)} (the Marian tokenizer's files are needed)")
    settings = _json(folder / "tokenizer_config.json", "MAX_CONFIG_BYTES", required=False) or {}
    separate = settings.get("separate_vocabs") is True if isinstance(settings, dict) else False
    vocab = read_vocab(folder / "vocab.json")
    target_vocab = read_vocab(folder / "target_vocab.json") if separate else vocab
    built = []
    for name, entries, size in (("vocab.json", vocab, cfg.src_vocab),
                                ("target_vocab.json" if separate else "vocab.json", target_vocab, cfg.tgt_vocab)):
        try:
            piece_vocab = PieceVocab(entries)
        except ValueError as error:
            raise UsageError(f"{folder / name}: {error}") from None
        if len(piece_vocab) != size:
            raise UsageError(f"{folder / name}: {len(piece_vocab)} entries; config.json's vocabulary has {size}")
        built.append(piece_vocab)
    source_spm, target_spm = load_processor(folder / "source.spm")[0], load_processor(folder / "target.spm")[0]
    try:
        source = SentencePieceSource(source_spm, built[0], "source.spm")
        target = SentencePieceTarget(target_spm, built[1], "target.spm", joiner=None if separate else source_spm)
    except ValueError as error:
        raise UsageError(f"{folder / 'vocab.json'}: {error}") from None
    for what, ours, theirs in (("eos_token_id", target.eos_id, cfg.eos_id),
                               ("pad_token_id", target.pad_id, cfg.pad_id)):
        if ours != theirs:
            raise UsageError(f"{folder / CONFIG}: {what} is {theirs}, but the vocabulary puts "
                             f"{'</s>' if what.startswith('eos') else PAD_TOKEN} at {ours}", what)
    return source, target


def import_marian(folder: str | Path, out: str | Path) -> dict[str, Any]:
    """Read the Marian folder, write the run folder `out`; returns config.json's origin entry."""
    folder, out = Path(folder), Path(out)
    if not folder.is_dir():
        raise UsageError(f"{folder}: not a folder (download one with `huggingface-cli download "
                         "Helsinki-NLP/opus-mt-zh-en --local-dir opus-mt-zh-en`)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out}: exists and is not an empty folder")
    cfg = marian.model_config(_json(folder / CONFIG, "MAX_CONFIG_BYTES"), str(folder / CONFIG))
    generation = _json(folder / "generation_config.json", "MAX_CONFIG_BYTES", required=False)
    source, target = read_tokenizers(folder, cfg)
    tensors = read_tensors(folder, cfg)
    cfg = marian.embedding_sharing(cfg, tensors)
    state = marian.to_glassformer(tensors, cfg, str(folder))
    model = Transformer(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise UsageError(f"{folder}: the weights do not fit the model (missing {sorted(missing)[:2]})")
    parameters = sum(p.numel() for p in model.parameters())
    origin = {"kind": "imported", "from": str(folder.resolve()), "format": FORMAT, "parameters": parameters,
              "summary": f"imported from {folder.resolve()} ({FORMAT}, {parameters:,} parameters)"}
    beams = generation.get("num_beams") if isinstance(generation, dict) else None
    if type(beams) is int and 1 <= beams <= limits.MAX_BEAM:              # what `translate --beam` would take
        origin["num_beams"] = beams
    with staged_folder(out, "the run folder") as staging:      # `out` appears whole or not at all
        for name in ("source.spm", "target.spm"):
            shutil.copyfile(folder / name, staging / name)
        write_json(staging / VOCAB, {"source": source.to_dict(), "target": target.to_dict()})
        save_weights(model, staging / MODEL)
        write_json(staging / CONFIG, {"model": cfg.to_dict(), "train": {}, "origin": origin})
    return origin


# ---- glassformer import ------------------------------------------------------------------------
def add_import_arguments(parser) -> None:
    from ..options import folder_path

    parser.add_argument("folder", metavar="HF_DIR", help="a Hugging Face Marian folder (e.g. opus-mt-zh-en)")
    parser.add_argument("--out", required=True, metavar="RUN_DIR", type=folder_path,
                        help="the run folder to write (new or empty)")


def import_command(args) -> int:
    origin = import_marian(args.folder, args.out)
    print(f"{args.out}: {origin['summary']}")
    return 0
