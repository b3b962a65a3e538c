"""When and how the static decoding step (static.py) is compiled: `--compile auto|on|off`, the C++ compiler
it needs, the options inductor gets, and the folder its compiled artefacts are cached in.

    mode = compile_mode("auto", sentences=200)     # "on" / "off", with the reason when it is off
    use_compile_cache(None)                        # at an entry point, before the first compilation

inductor writes C++ and builds it with the system's compiler; the first run of a model and shape pays
that (tens of seconds on 2 cores), later runs load the built code from the cache folder. The cache
folder is a per-process setting read from the environment (TORCHINDUCTOR_CACHE_DIR), so it is set once,
where a program starts, never inside a forward.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

COMPILE_MODES = ("auto", "on", "off")
AUTO_MIN_SENTENCES = 500       # auto: compile only for jobs long enough to win back a cached start (seconds)
COMPILE_OPTIONS = {"cpp_wrapper": True}   # the graph's calls from C++, not Python: 1.07x (docs/performance.md)
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def cxx_compiler() -> str | None:
    """The C++ compiler inductor would use ($CXX, else c++ / g++ / clang++ on PATH), or None."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else []
    for name in (*names, "c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    return None


def compile_mode(requested: str, sentences: int) -> tuple[bool, str | None]:
    """Whether to compile the decoding step, and a one-line note when `on` was asked for but cannot be.

    auto: on when a C++ compiler is found and the job has more than AUTO_MIN_SENTENCES sentences."""
    if requested not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {COMPILE_MODES}, got {requested!r}")
    if requested == "off":
        return False, None
    if cxx_compiler() is None:
        note = "--compile on: no C++ compiler found (g++, clang++ or $CXX); decoding eagerly"
        return False, note if requested == "on" else None
    return requested == "on" or sentences > AUTO_MIN_SENTENCES, None


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/glassformer/inductor, else ~/.cache/glassformer/inductor."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "glassformer" / "inductor"


def use_compile_cache(folder: str | os.PathLike | None = None) -> Path:
    """Point inductor's cache at `folder` (default: an already set TORCHINDUCTOR_CACHE_DIR, else
    default_cache_dir()). Call at an entry point, before anything is compiled in this process."""
    if folder is not None:
        path = Path(folder).expanduser()
    elif os.environ.get(CACHE_ENV):
        path = Path(os.environ[CACHE_ENV])
    else:
        path = default_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    os.environ[CACHE_ENV] = str(path)
    return path
