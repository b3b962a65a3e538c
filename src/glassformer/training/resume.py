"""Opening a run folder and continuing a run (`train --resume`): a new run's folder checked, the last checkpoint
read back whole and file by file, and the random state of every process (each DDP rank draws its own dropout
masks) gathered for the next checkpoint."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from ..data.checkpoint import (
    CONFIG,
    METRICS,
    MODEL,
    OPTIMIZER,
    STATE,
    VOCAB,
    ConfigFile,
    atomic_path,
    load_optimizer,
    load_weights,
    read_run_json,
    resume_folder,
    rng_state,
    set_rng_state,
    step_folder,
)
from ..errors import UsageError
from ..validation import validate
from .settings import TrainSettings, resolve_settings, resumed_settings


def open_run(out: Path, resume: bool, args) -> tuple[TrainSettings, dict | None]:
    """The settings (saved ones on --resume) and the saved vocabularies (None for a new run). A new run refuses a
    folder that holds a run, lies inside one (its best/ or checkpoints/step-N) or holds weights or a state."""
    config = out / CONFIG
    if not resume:
        if config.exists():
            raise UsageError(f"{out} already holds a run: pass --resume to continue it, or choose another --out")
        inside = next((p for p in out.resolve().parents if (p / CONFIG).is_file() and (p / VOCAB).is_file()), None)
        if inside is not None:
            raise UsageError(f"--out {out}: inside the run {inside}; choose a folder outside it")
        if any((out / name).exists() for name in (MODEL, OPTIMIZER, STATE)):
            raise UsageError(f"--out {out}: holds weights or a training state; choose another --out")
        return resolve_settings(args), None
    if not config.is_file():
        raise UsageError(f"--resume: {out} holds no run (no {CONFIG}); nothing to resume — leave out --resume to "
                         "start one")
    saved = validate(ConfigFile, read_run_json(config, "MAX_CONFIG_BYTES"), str(config))
    return resumed_settings(saved.train, args, f"{config}: train"), read_run_json(out / VOCAB, "MAX_VOCAB_BYTES")


def load_checkpoint(out: Path, model, optimizer: torch.optim.Optimizer, device: torch.device, dist) -> dict | None:
    """The last checkpoint of the run `out`: its state.json, then the weights and the optimizer of the step it names
    (their own folder, complete even where a cut save left the top half new), and this rank's random state. None
    for a run stopped before its first checkpoint (it starts at step 0 with its saved settings); a file that cannot
    be read is one line naming it."""
    path = out / STATE
    if not path.is_file():
        if dist.main:
            print(f"--resume: {out} has no checkpoint yet (stopped before its first); starting at step 0 with its "
                  "saved settings", file=sys.stderr)
        return None
    state = checked_state(read_run_json(path, "MAX_STATE_BYTES"), path)
    folder = resume_folder(out, state)
    for name, load, into in ((MODEL, load_weights, model), (OPTIMIZER, load_optimizer, optimizer)):
        try:
            load(into, folder / name)
        except (SafetensorError, ValueError, RuntimeError, KeyError, OSError) as error:
            detail = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
            raise UsageError(f"{folder / name}: cannot resume from it ({detail})") from None
    for group in optimizer.param_groups:
        for p in group["params"]:
            for k, v in optimizer.state.get(p, {}).items():
                if torch.is_tensor(v) and k != "step":
                    optimizer.state[p][k] = v.to(device)
    ranks = state.get("rng_ranks")                  # DDP: each rank's own, where the world is the saved one
    rng = ranks[dist.rank] if isinstance(ranks, list) and len(ranks) == dist.world else state["rng"]
    try:
        set_rng_state(rng)
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as error:
        raise UsageError(f"{path}: rng: not a saved random state ({type(error).__name__})", "rng") from None
    return state


def trim_metrics(out: Path, step: int) -> None:
    """metrics.jsonl as it stood at the checkpoint a run resumes from (step `step`; 0 for a run stopped before its
    first): the lines of steps after it, which the resumed run logs again, and a line a hard stop cut short are
    dropped (the file replaced whole, only when a line goes)."""
    path = out / METRICS
    if not path.is_file():
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [line for line in f if line.strip()]
    kept = [line if line.endswith("\n") else line + "\n" for line in lines if _logged_by(line, step)]
    if len(kept) < len(lines):
        with atomic_path(path) as tmp:
            tmp.write_text("".join(kept), encoding="utf-8")


def _logged_by(line: str, step: int) -> bool:
    """Whether a metrics line is whole and of the run up to `step` (a line without a step, the average, is kept)."""
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and not (isinstance(record.get("step"), int) and record["step"] > step)


def gathered_rng(dist) -> list | None:
    """Every rank's random state (every rank calls this), for rank 0's checkpoint; None in one process."""
    if not dist.active:
        return None
    import torch.distributed as tdist

    states: list = [None] * dist.world
    tdist.all_gather_object(states, rng_state())
    return states


def checked_state(raw: Any, path: Path) -> dict[str, Any]:
    """state.json as a resumed run reads it: a JSON object whose counters are integers >= 0 and whose checkpoint
    names are step folders (checkpoint.step_folder: nothing outside checkpoints/); one line naming the field."""
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: expected a JSON object (a run's state), got {type(raw).__name__}")
    for field in ("step", "epoch", "position"):
        value = raw.get(field)
        if type(value) is not int or value < 0:
            raise UsageError(f"{path}: {field}: expected an integer >= 0, got {str(value)[:40]!r}", field)
    if not isinstance(raw.get("checkpoints"), list) or not isinstance(raw.get("rng"), dict):
        raise UsageError(f"{path}: checkpoints and rng: a list and an object are expected", "checkpoints")
    for name in raw["checkpoints"]:
        step_folder(path.parent, name)
    return raw
