"""Where glassformer looks by default: the trained model folder, the same for the CLI, the lab and the notebooks;
a file written whole, once, by one process at a time (`write_whole`); a zip member taken out once (`unpacked`)."""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
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


@contextmanager
def unpacked(archive: Path, suffix: str) -> Iterator[Path]:
    """The member of zip `archive` whose name ends with `suffix` (the first), taken out once into the folder `unpacked`
    beside it (`write_whole`) under the archive's name, size and time, so that a rewritten archive gets its own: its
    path, which every later use, in any process, reads there. torch's package loader unpacked a package into a new
    temporary folder at every load (~5-30 ms), removed only when the loader was freed: a killed process left it.
    Where the folder cannot be written (a read-only cache), a temporary copy, removed when the block ends (a shared
    library can go once it is loaded)."""
    stat = archive.stat()
    path = archive.parent / "unpacked" / f"{archive.stem}.{stat.st_size}-{stat.st_mtime_ns}{suffix}"
    if path.exists():
        yield path
        return
    with zipfile.ZipFile(archive) as z:
        member = next(n for n in z.namelist() if n.endswith(suffix))

        def write(partial: Path) -> None:
            with z.open(member) as src, open(partial, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        try:
            write_whole(path, write)
        except OSError:                                                      # not ours to write: a private copy
            with tempfile.TemporaryDirectory(prefix="glassformer-") as folder:
                write(Path(folder) / path.name)
                yield Path(folder) / path.name
            return
    yield path
