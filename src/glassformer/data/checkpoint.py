"""Run folders: JSON for config, vocabularies and state; safetensors for weights and optimizer state.

Nothing is ever unpickled. Every file is written atomically (temp file in the same folder, fsync,
os.replace), so an interrupted save leaves the previous file intact. Layout of a run folder:

    config.json              {"model": ModelConfig.to_dict(), "train": training arguments}
    vocab.json               {"source": SourceTokenizer.to_dict(), "target": TargetTokenizer.to_dict()}
    state.json               step, epoch, position, RNG states, best dev BLEU, recent checkpoints
    model.safetensors        latest weights (tied target embedding stored once)
    optimizer.safetensors    Adam's state tensors by name; param groups as JSON metadata
    checkpoints/step-N/      the last K checkpoints (the same three files, hard links when possible)
    best/                    model.safetensors + state.json of the best dev BLEU
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model, save_file, save_model
from torch import nn

from .. import limits
from ..errors import UsageError
from ..model import ModelConfig, Transformer
from ..validation import Schema, load_json, validate
from .sentencepiece import is_sentencepiece, load_pair
from .tokenize import SourceTokenizer, TargetTokenizer

CONFIG, VOCAB, STATE = "config.json", "vocab.json", "state.json"
MODEL, OPTIMIZER = "model.safetensors", "optimizer.safetensors"
METRICS = "metrics.jsonl"            # a run's log: one JSON line per --log-every steps and per epoch
_UMASK = os.umask(0o022)
os.umask(_UMASK)
FOLDER_MODE = 0o777 & ~_UMASK        # what mkdir gives a folder here (mkdtemp's own are 0o700)


# ---- atomic writes -------------------------------------------------------------------------
@contextlib.contextmanager
def atomic_path(path: str | Path):
    """Yield a temp path beside `path`; on success fsync it and os.replace it onto `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json(path: str | Path, data: Any) -> None:
    """Write JSON atomically (UTF-8, indented)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def link_or_copy(src: str | Path, dst: str | Path) -> None:
    """Place `src` at `dst` atomically: a hard link when the file system allows, else a copy."""
    with atomic_path(dst) as tmp:
        os.unlink(tmp)
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)


# ---- weights -------------------------------------------------------------------------------
def save_weights(model: nn.Module, path: str | Path) -> None:
    """model.safetensors; shared (tied) tensors are stored once by safetensors' save_model."""
    with atomic_path(path) as tmp:
        save_model(model, str(tmp))


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Fill `model` from a safetensors file (strict: every tensor must match)."""
    missing, unexpected = load_model(model, str(path), strict=False)
    if missing or unexpected:
        raise ValueError(f"{path}: weights do not fit the model (missing {sorted(missing)[:3]}, "
                         f"unexpected {sorted(unexpected)[:3]})")


# ---- optimizer -----------------------------------------------------------------------------
def save_optimizer(optimizer: torch.optim.Optimizer, path: str | Path) -> None:
    """Adam's per-parameter tensors as `state.{param}.{name}`; param groups as JSON metadata."""
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for p, entry in sd["state"].items():
        for name, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"state.{p}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(p), {})[name] = value
    meta = {"param_groups": json.dumps(sd["param_groups"]), "scalars": json.dumps(scalars)}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)


def load_optimizer(optimizer: torch.optim.Optimizer, path: str | Path) -> None:
    """Inverse of `save_optimizer`."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        state: dict[int, dict[str, Any]] = {}
        for key in f.keys():
            _, p, name = key.split(".", 2)
            state.setdefault(int(p), {})[name] = f.get_tensor(key)
    for p, entry in json.loads(meta.get("scalars", "{}")).items():
        state.setdefault(int(p), {}).update(entry)
    groups = [{k: (tuple(v) if isinstance(v, list) and k != "params" else v) for k, v in g.items()}
              for g in json.loads(meta["param_groups"])]                     # JSON lists -> tuples (betas)
    optimizer.load_state_dict({"state": state, "param_groups": groups})


# ---- RNG states ----------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """torch, Python `random` and NumPy generator states as JSON-able values (no pickle)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    raw = np.frombuffer(base64.b64decode(state["torch"]), dtype=np.uint8).copy()
    torch.set_rng_state(torch.from_numpy(raw))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


# ---- whole checkpoints ---------------------------------------------------------------------
STEP_NAME = re.compile(r"step-\d{1,12}")    # a checkpoint folder's name, as state["checkpoints"] lists it


def step_folder(run: Path, name: Any) -> Path:
    """run/checkpoints/NAME for a name of STEP_NAME's form; anything else (`../x` from an edited state.json) is a
    UsageError, so nothing outside checkpoints/ is read or removed."""
    if not isinstance(name, str) or not STEP_NAME.fullmatch(name):
        raise UsageError(f"{run / STATE}: checkpoints: {str(name)[:40]!r} is not a checkpoint name (step-N)",
                         "checkpoints")
    return run / "checkpoints" / name


def save_checkpoint(run: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                    state: dict[str, Any], keep: int = 3) -> Path:
    """Weights, optimizer and state of this step written whole into checkpoints/step-N (its state.json last:
    the folder is complete once that is there), then linked to the top of the run folder, state.json last:
    the top's state.json always names a step whose folder is complete (`resume_folder`). A save cut anywhere
    (Ctrl-C twice, a full disk) leaves the checkpoint before it as it was. Keeps the last `keep` step folders
    (`keep` 0: none; the files written at the top directly); records them in state["checkpoints"]."""
    run = Path(run)
    step_dir = step_folder(run, f"step-{state['step']}")
    recent = [c for c in state.get("checkpoints", []) if c != step_dir.name] + [step_dir.name]
    drop, recent = recent[:-keep] if keep > 0 else recent, recent[-keep:] if keep > 0 else []
    state = {**state, "checkpoints": recent}
    into = step_dir if keep > 0 else run
    try:
        save_weights(model, into / MODEL)
        if optimizer is not None:
            save_optimizer(optimizer, into / OPTIMIZER)
        write_json(into / STATE, state)
    except SafetensorError as error:                 # safetensors' own I/O errors: one line, as an OSError's
        raise OSError(f"checkpoint step-{state['step']} not written ({str(error).strip()[:120]}); the one before "
                      "it is intact") from None
    if keep > 0:
        for name in (MODEL, OPTIMIZER, STATE):                              # the state last
            if (step_dir / name).exists():
                link_or_copy(step_dir / name, run / name)
    for name in drop:
        shutil.rmtree(step_folder(run, name), ignore_errors=True)
    return step_dir


def resume_folder(run: Path, state: dict[str, Any]) -> Path:
    """Where a resumed run reads its weights and optimizer: the folder of the step the top's state.json names
    (complete whatever a cut save left at the top), else the top itself (a run kept with --keep 0)."""
    folder = step_folder(run, f"step-{state['step']}")
    return folder if (folder / STATE).is_file() else run


def save_best(run: str | Path, model: nn.Module, state: dict[str, Any]) -> None:
    """best/: the weights that scored the best dev BLEU, with their state."""
    best = Path(run) / "best"
    save_weights(model, best / MODEL)
    write_json(best / STATE, state)


def save_run_files(run: str | Path, cfg: ModelConfig, train_args: dict[str, Any],
                   source: SourceTokenizer, target: TargetTokenizer) -> None:
    """config.json and vocab.json: everything needed to rebuild the model and its tokenizers."""
    run = Path(run)
    write_json(run / VOCAB, {"source": source.to_dict(), "target": target.to_dict()})
    write_json(run / CONFIG, {"model": cfg.to_dict(), "train": train_args})   # last: it marks a run (--resume)


def find_run_root(folder: str | Path) -> Path:
    """The folder holding config.json: `folder` itself, or a run above a checkpoint/best folder."""
    folder = Path(folder)
    for candidate in (folder, folder.parent, folder.parent.parent):
        if (candidate / CONFIG).is_file() and (candidate / VOCAB).is_file():
            return candidate
    raise UsageError(f"{folder}: not a trained model folder (no {CONFIG} and {VOCAB}); "
                     "train one with `make demo` or `glassformer train --out DIR`")


def weights_path(folder: str | Path) -> Path:
    """Which weights a model folder serves: best/ if it exists, else the latest."""
    folder = Path(folder)
    for candidate in (folder / "best" / MODEL, folder / MODEL):
        if candidate.is_file():
            return candidate
    raise UsageError(f"{folder}: no {MODEL} (training has not saved a checkpoint yet)")


class ConfigFile(Schema):
    """config.json: the model's ModelConfig fields and the settings it was trained with."""

    model: dict
    train: dict = {}
    origin: dict = {}              # where the weights come from, e.g. {"kind": "imported", "summary": ...}


class VocabFile(Schema):
    """vocab.json: both tokenizers, as their to_dict() wrote them."""

    source: dict
    target: dict


def read_run_json(path: Path, limit: str) -> Any:
    """A run folder's JSON file: its size within `limit` (glassformer.limits) before reading, one line per problem."""
    limits.check(f"{path}: size in bytes", path.stat().st_size, limit)
    return load_json(path.read_bytes(), str(path))


def weight_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a safetensors header (no tensor is read); a broken file is one UsageError."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as error:
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UsageError(f"{path}: not a readable safetensors file ({detail})") from None


def check_weights(path: Path, model: Transformer) -> None:
    """The file's tensors against the shapes of `model` (built from a config within glassformer.limits, so its size
    is bounded; not on the meta device, whose first use imports torch's reference ops: over a second of start-up)."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = weight_shapes(path)
    for name, shape in found.items():
        if name not in expected:
            raise UsageError(f"{path}: tensor {name!r} is not part of the model config.json describes")
        if shape != expected[name]:
            raise UsageError(f"{path}: tensor {name} has shape {list(shape)}; config.json implies "
                             f"{list(expected[name])}")
    if not found:
        raise UsageError(f"{path}: holds no tensors")


def load_translator_parts(folder: str | Path, device: str | torch.device = "cpu"
                          ) -> tuple[Transformer, SourceTokenizer, TargetTokenizer, dict[str, Any]]:
    """Model (eval mode), source and target tokenizers, and config.json of a model folder.

    Everything is checked before the model is allocated: config.json's types and sizes (the
    validation layer and glassformer.limits), vocab.json against the embedding sizes; then the
    safetensors header's tensor shapes against the model's, before a weight is read. Any problem
    is one UsageError line.
    """
    folder = Path(folder)
    if not folder.exists():
        raise UsageError(f"model folder {folder} does not exist; train one with `make demo` "
                         "or `glassformer train --out DIR`")
    root = find_run_root(folder)
    config = validate(ConfigFile, read_run_json(root / CONFIG, "MAX_CONFIG_BYTES"), str(root / CONFIG))
    cfg = ModelConfig.from_dict(config.model, f"{root / CONFIG}: model")
    vocab = validate(VocabFile, read_run_json(root / VOCAB, "MAX_VOCAB_BYTES"), str(root / VOCAB))
    source, target = _tokenizers(root / VOCAB, vocab)
    for side, size, want in (("source", source.vocab_size, cfg.src_vocab), ("target", target.vocab_size,
                                                                            cfg.tgt_vocab)):
        if size != want:
            field = "src_vocab" if side == "source" else "tgt_vocab"
            raise UsageError(f"{root / VOCAB}: the {side} vocabulary has {size} entries; config.json's "
                             f"model.{field} is {want} (the files do not belong together)")
    weights = weights_path(folder)
    model = Transformer(cfg)
    check_weights(weights, model)
    try:
        load_weights(model, weights)
    except (SafetensorError, ValueError, RuntimeError) as error:
        line = str(error).splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(line if line.startswith(f"{weights}: ") else f"{weights}: {line}") from None
    model.to(device).eval()
    return model, source, target, {"model": config.model, "train": config.train, "origin": config.origin}


def origin_summary(folder: str | Path) -> str:
    """Where a model folder's weights come from: "imported from DIR (...)" or "trained here (N parameters)"."""
    root = find_run_root(folder)
    config = validate(ConfigFile, read_run_json(root / CONFIG, "MAX_CONFIG_BYTES"), str(root / CONFIG))
    summary = config.origin.get("summary")
    if isinstance(summary, str) and summary:
        return summary
    from ..model.config import parameter_count

    cfg = ModelConfig.from_dict(config.model, f"{root / CONFIG}: model")
    return f"trained here ({parameter_count(cfg):,} parameters)"


def _tokenizers(path: Path, vocab: VocabFile) -> tuple[SourceTokenizer, TargetTokenizer]:
    """Both tokenizers of vocab.json; a malformed entry is one UsageError naming the side.

    glassformer's own (SourceTokenizer, TargetTokenizer), or SentencePiece models beside vocab.json
    (an imported Marian model: glassformer.data.sentencepiece)."""
    if is_sentencepiece(vocab.source) or is_sentencepiece(vocab.target):
        return load_pair(path.parent, vocab.source, vocab.target)
    try:
        source = SourceTokenizer.from_dict(vocab.source)
    except Exception as error:  # untrusted file: any failure to rebuild is the file's fault
        raise UsageError(f"{path}: source: not a source tokenizer ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''})") from None
    try:
        target = TargetTokenizer.from_dict(vocab.target)
    except Exception as error:  # the tokenizers library raises plain Exception for a malformed string
        raise UsageError(f"{path}: target: not a target tokenizer ({type(error).__name__}: "
                         f"{str(error).splitlines()[0][:200] if str(error) else ''})") from None
    limits.check(f"{path}: source vocabulary entries", source.vocab_size, "MAX_VOCAB")
    return source, target


def average_into(model: nn.Module, paths: list[str | Path]) -> None:
    """Load the element-wise mean of several checkpoints' weights into `model` (checkpoint averaging)."""
    total: dict[str, torch.Tensor] = {}
    for path in paths:
        load_weights(model, path)
        for k, v in model.state_dict().items():
            total[k] = total[k] + v.double() if k in total else v.double().clone()
    model.load_state_dict({k: (v / len(paths)).to(model.state_dict()[k].dtype) for k, v in total.items()})
