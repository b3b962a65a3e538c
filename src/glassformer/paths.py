"""Where glassformer looks by default: the trained model folder, the same for the CLI, the lab and the notebooks;
and a file written whole, once, by one process at a time (`write_whole`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

DEFAULT_MODEL = "runs/default"
MODEL_ENV = "GLASSFORMER_MODEL"


def default_model_dir(root: str | Path = ".") -> Path:
    """$GLASSFORMER_MODEL if set (and not empty), else `root`/runs/default (the folder `make demo` trains).

    `root` is the repository root as seen from the caller's working directory ("../.." from a notebook).
    """
    return Path(os.environ.get(MODEL_ENV) or Path(root) / DEFAULT_MODEL)


def write_whole(path: Path, write: Callable[[Path], object], replace: bool = False) -> bool:
    """`write(partial)` to a temporary name beside `path`, then renamed to it — unless `path` is there by then and
    not to be replaced. One process at a time (flock on the folder, so no lock file is left; none where the OS has
    no flock): a process that waited finds the file written. A failed or interrupted write leaves nothing. Returns
    whether this call wrote."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.parent):
        if path.exists() and not replace:
            return False
        partial = path.with_name(f".{path.stem}.{os.getpid()}.partial{path.suffix}")
        try:
            write(partial)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
        return True


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:                                                      # Windows
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)                                                         # closing releases the lock
