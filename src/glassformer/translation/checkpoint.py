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
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_model, save_file, save_model
from torch import nn

from ..errors import UsageError
from ..model import ModelConfig, Transformer
from .tokenize import SourceTokenizer, TargetTokenizer

CONFIG, VOCAB, STATE = "config.json", "vocab.json", "state.json"
MODEL, OPTIMIZER = "model.safetensors", "optimizer.safetensors"
_UMASK = os.umask(0o022)
os.umask(_UMASK)


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


def load_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


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


def load_optimizer(optimizer: torch.optim.Optimizer, path: str | Path, model: nn.Module | None = None) -> None:
    """Inverse of `save_optimizer`. With `model`, state saved when cross-attention kept one fused in_proj
    (one parameter fewer per weight and bias) is re-indexed to the split q_proj / kv_proj."""
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
    if model is not None and len(groups) == 1:
        state, groups[0]["params"] = _from_fused_layout(model, state, groups[0]["params"])
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def _from_fused_layout(model: nn.Module, state: dict, saved: list[int]) -> tuple[dict, list[int]]:
    """Optimizer state indexed as before cross-attention split its in_proj -> indexed as the model is now."""
    plan, n_old, fused = [], 0, {}
    for name, _ in model.named_parameters():                             # the order of model.parameters()
        owner, _, attr = name.rpartition(".")
        attention, _, proj = owner.rpartition(".")
        if proj in ("q_proj", "kv_proj") and attention.endswith("cross_attention"):
            if (attention, attr) not in fused:
                fused[(attention, attr)] = n_old
                n_old += 1
            n_q = model.get_submodule(attention).q_proj.out_features
            plan.append((fused[(attention, attr)], slice(0, n_q) if proj == "q_proj" else slice(n_q, None)))
        else:
            plan.append((n_old, None))
            n_old += 1
    if not fused or len(saved) != n_old or len(saved) == len(plan):
        return state, saved                                                  # already the current layout
    moved = {}
    for new, (old, rows) in enumerate(plan):
        if old in state:
            moved[new] = {k: (v if not torch.is_tensor(v) else v[rows].clone() if rows is not None and v.dim()
                              else v.clone()) for k, v in state[old].items()}   # each its own `step` counter
    return moved, list(range(len(plan)))


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
def save_checkpoint(run: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                    state: dict[str, Any], keep: int = 3) -> Path:
    """Latest weights/optimizer/state at the top of the run folder, linked into checkpoints/step-N.

    Keeps the last `keep` step folders; records them in state["checkpoints"].
    """
    run = Path(run)
    step_dir = run / "checkpoints" / f"step-{state['step']}"
    recent = [c for c in state.get("checkpoints", []) if c != step_dir.name] + [step_dir.name]
    drop, recent = recent[:-keep] if keep > 0 else recent, recent[-keep:] if keep > 0 else []
    state = {**state, "checkpoints": recent}
    save_weights(model, run / MODEL)
    if optimizer is not None:
        save_optimizer(optimizer, run / OPTIMIZER)
    write_json(run / STATE, state)
    if keep > 0:
        step_dir.mkdir(parents=True, exist_ok=True)
        for name in (MODEL, OPTIMIZER, STATE):
            if (run / name).exists():
                link_or_copy(run / name, step_dir / name)
    for name in drop:
        shutil.rmtree(run / "checkpoints" / name, ignore_errors=True)
    return step_dir


def save_best(run: str | Path, model: nn.Module, state: dict[str, Any]) -> None:
    """best/: the weights that scored the best dev BLEU, with their state."""
    best = Path(run) / "best"
    save_weights(model, best / MODEL)
    write_json(best / STATE, state)


def save_run_files(run: str | Path, cfg: ModelConfig, train_args: dict[str, Any],
                   source: SourceTokenizer, target: TargetTokenizer) -> None:
    """config.json and vocab.json: everything needed to rebuild the model and its tokenizers."""
    run = Path(run)
    write_json(run / CONFIG, {"model": cfg.to_dict(), "train": train_args})
    write_json(run / VOCAB, {"source": source.to_dict(), "target": target.to_dict()})


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


def load_translator_parts(folder: str | Path, device: str | torch.device = "cpu"
                          ) -> tuple[Transformer, SourceTokenizer, TargetTokenizer, dict[str, Any]]:
    """Model (eval mode), source and target tokenizers, and config.json of a model folder."""
    folder = Path(folder)
    if not folder.exists():
        raise UsageError(f"model folder {folder} does not exist; train one with `make demo` "
                         "or `glassformer train --out DIR`")
    root = find_run_root(folder)
    config = read_json(root / CONFIG)
    vocab = read_json(root / VOCAB)
    # Folders written before ModelConfig dropped `activation` (always "relu") and `extra` still load;
    # their cross-attention weights (one fused in_proj) are split by CrossAttention on loading.
    cfg = ModelConfig.from_dict({k: v for k, v in config["model"].items() if k not in ("activation", "extra")})
    model = Transformer(cfg)
    load_weights(model, weights_path(folder))
    model.to(device).eval()
    return model, SourceTokenizer.from_dict(vocab["source"]), TargetTokenizer.from_dict(vocab["target"]), config


def average_into(model: nn.Module, paths: list[str | Path]) -> None:
    """Load the element-wise mean of several checkpoints' weights into `model` (checkpoint averaging)."""
    total: dict[str, torch.Tensor] = {}
    for path in paths:
        load_weights(model, path)
        for k, v in model.state_dict().items():
            total[k] = total[k] + v.double() if k in total else v.double().clone()
    model.load_state_dict({k: (v / len(paths)).to(model.state_dict()[k].dtype) for k, v in total.items()})
