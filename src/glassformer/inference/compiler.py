"""When and how the static decoding step (static.py) is compiled: `--compile auto|on|off`, the C++ compiler
it needs, the ahead-of-time build of the step, and the folder its packages are kept in.

    mode = compile_mode("auto", sentences=200)     # "on" / "off", with the reason when it is off
    use_compile_cache(None)                        # at an entry point, before the first compilation
    step = compiled(StepGraph(...), example_inputs, dynamic_shapes, facts)

Each part of the static step (static.py: the source side, and the step of each beam size) is traced once
by `torch.export` with every size symbolic (rows, target positions, source positions, the output limit),
then built by AOTInductor into one package (generated C++ compiled by the system's compiler, the weights
inside): the model's first run pays that build (tens of seconds a part on 2 cores), later runs load the
package from the cache folder in a fraction of a second, and one package serves every batch and sentence
length. The package's name is a hash of everything its code depends on: the weights and sizes, the beam,
the code of the model, of this layer and of the search, the torch version and the CPU's instruction set,
so a changed model, program or machine builds a new one and never loads a stale one.

This is the one place that calls AOTInductor (`torch._inductor.aoti_compile_and_package` and
`aoti_load_package`, its documented entry points: https://pytorch.org/docs/stable/torch.compiler_aot_inductor.html),
and the one place that reaches past them: a package is loaded by the C++ loader `aoti_load_package` itself
builds (`torch._C._aoti.AOTIModelPackageLoader`, so a cached start does not import inductor) and run through
it with one list of tensors (`Package`), not through the generic __call__.
Training's `--compile` uses torch.compile and shares the compiler detection and the cache folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from .threads import use_threads

COMPILE_MODES = ("auto", "on", "off")
AUTO_MIN_SENTENCES = 100       # auto: build a package only for jobs long enough to win its build back
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
PACKAGES = "packages"          # below the cache folder: one .pt2 per model and beam size
BUILD_THREADS = 1              # the package's own loops are generated for this many threads (its products run
                               # on torch's threads of the moment) unless facts["threads"] says otherwise: one,
                               # so a batch-1 step enters no parallel region (static.py: beams build for theirs)


def cxx_compiler() -> str | None:
    """The C++ compiler inductor would use ($CXX, else c++ / g++ / clang++ on PATH), or None."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else []
    for name in (*names, "c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    return None


def compile_mode(requested: str, sentences: int, cached: bool = False) -> tuple[bool, str | None]:
    """Whether to compile the decoding step, and a one-line note when `on` was asked for but cannot be.

    auto: on when a C++ compiler is found and the package is already built (`cached`) or the job has more
    than AUTO_MIN_SENTENCES sentences."""
    if requested not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {COMPILE_MODES}, got {requested!r}")
    if requested == "off":
        return False, None
    if cxx_compiler() is None:
        note = "--compile on: no C++ compiler found (g++, clang++ or $CXX); decoding eagerly"
        return False, note if requested == "on" else None
    return requested == "on" or cached or sentences > AUTO_MIN_SENTENCES, None


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/glassformer/inductor, else ~/.cache/glassformer/inductor."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "glassformer" / "inductor"


# The user's TORCHINDUCTOR_CACHE_DIR, read when glassformer starts: once inductor has run, the variable
# holds inductor's own default (a folder under /tmp), which is not the user's choice.
_USER_FOLDER = os.environ.get(CACHE_ENV)
_folder: Path | None = None       # the cache folder chosen by use_compile_cache


def use_compile_cache(folder: str | os.PathLike | None = None) -> Path:
    """Choose the cache folder: `folder`, else the user's TORCHINDUCTOR_CACHE_DIR, else default_cache_dir().
    Packages go to its packages/ folder, inductor's own kernel cache to the folder itself (the variable is
    set for it). Call at an entry point, before anything is compiled in this process."""
    global _folder
    path = Path(folder).expanduser() if folder is not None else Path(_USER_FOLDER or default_cache_dir())
    path.mkdir(parents=True, exist_ok=True)
    os.environ[CACHE_ENV] = str(path)
    _folder = path
    return path


def package_path(module: nn.Module, facts: dict) -> Path:
    """Where the package of `module` is kept: <cache folder>/packages/<kind>-<hash>.pt2."""
    folder = (_folder or Path(_USER_FOLDER or default_cache_dir())) / PACKAGES
    return folder / f"{facts['kind']}-{_fingerprint(module, facts)}.pt2"


def _fingerprint(module: nn.Module, facts: dict) -> str:
    """A hash of what the compiled code depends on: `facts`, the weights and their names, the code of the
    model and of this speed layer (and the files listed in facts["code"]), torch and the CPU's instructions."""
    h = hashlib.sha256()
    machine = {"torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability(),
               "machine": platform.machine()}
    h.update(json.dumps({**facts, **machine}, sort_keys=True, default=str).encode())
    package = Path(__file__).resolve().parents[1]
    files = sorted([*package.glob("model/*.py"), *package.glob("inference/*.py")])
    for name in [*files, *facts.get("code", ())]:
        h.update(Path(name).read_bytes())
    for name, t in module.state_dict().items():
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:24]


def compiled(module: nn.Module, example: tuple, dynamic: tuple, facts: dict,
             notes: Callable[[str], None] | None = None, path: Path | None = None) -> Callable:
    """`module` (whose forward returns a flat tuple of tensors) as a compiled package, built now by tracing
    it on `example` inputs with the symbolic sizes `dynamic` (torch.export's dynamic_shapes), or loaded from
    the cache folder (at `path`, when the caller has it: `package_path` hashes every weight); should building
    or loading fail (no working C++ toolchain), `module` itself and one note."""
    path = package_path(module, facts) if path is None else path
    try:
        if not path.exists():
            what = "the decoding step's source side" if facts["kind"] == "source" else \
                f"the decoding step for beam {facts.get('beam')}"
            _note(notes, f"--compile: building {what} (once per model; later runs load it from {path.parent})")
            began = time.perf_counter()
            with torch.no_grad(), warnings.catch_warnings(), use_threads(facts.get("threads", BUILD_THREADS)):
                warnings.simplefilter("ignore", FutureWarning)              # torch's own deprecations while tracing
                program = torch.export.export(module, example, dynamic_shapes=dynamic)
                path.parent.mkdir(parents=True, exist_ok=True)
                partial = path.with_name(f"{path.stem}.{os.getpid()}.partial.pt2")
                torch._inductor.aoti_compile_and_package(program, package_path=str(partial))
            os.replace(partial, path)                                       # whole or absent, never half-written
            _note(notes, f"--compile: built in {time.perf_counter() - began:.1f} s")
        return Package(path)
    except Exception as error:                                              # compiler missing or failing
        first = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
        _note(notes, f"compiling the decoding step failed ({type(error).__name__}: {first}); decoding eagerly")
        return module


class Package:
    """A loaded package called like the module it was built from (tensors and lists of tensors in, a flat
    tuple of tensors out): its runner takes one list of tensors. (The package's own __call__ does this with
    torch's generic tree code, reading its specs anew at every call: at batch 1 that was a fifth of a step.)"""

    def __init__(self, path: Path) -> None:
        loader = getattr(getattr(torch._C, "_aoti", None), "AOTIModelPackageLoader", None)
        if loader is not None:                           # what aoti_load_package builds, without importing
            self.runner = loader(str(path), "model", False, 1, -1)   # inductor (1.5 s of a cached start)
        else:
            self.runner = torch._inductor.aoti_load_package(str(path)).loader

    def __call__(self, *inputs) -> tuple:
        flat = [t for x in inputs for t in (x if isinstance(x, (list, tuple)) else (x,))]
        return tuple(self.runner.boxed_run(flat))


def _note(notes: Callable[[str], None] | None, line: str) -> None:
    if notes is not None:
        notes(line)
