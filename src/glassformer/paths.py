"""Where glassformer looks by default: the trained model folder, the same for the CLI, the lab and the notebooks."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_MODEL = "runs/default"
MODEL_ENV = "GLASSFORMER_MODEL"


def default_model_dir(root: str | Path = ".") -> Path:
    """$GLASSFORMER_MODEL if set (and not empty), else `root`/runs/default (the folder `make demo` trains).

    `root` is the repository root as seen from the caller's working directory ("../.." from a notebook).
    """
    return Path(os.environ.get(MODEL_ENV) or Path(root) / DEFAULT_MODEL)
