"""Shared fixtures: deterministic seeds and small thread counts for a 2-core machine."""

import os

# Idle OpenMP threads sleep instead of spinning: on a busy 2-core machine spinning threads stall each other.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import importlib.abc  # noqa: E402
import importlib.util  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

# One intra-op thread: test tensors are tiny, and on a busy 2-core machine two threads wait on each other.
torch.set_num_threads(1)


def _lower_levels(cpp_builder) -> None:
    """cpp_builder's optimisation flags with O3 lowered to O1 (the kernels' level in this session's builds)."""
    levels = getattr(cpp_builder, "_get_optimization_cflags", None)
    if levels is None:                                                       # another torch: its own levels
        return

    def lower(cpp_compiler, min_optimize=False):
        cflags, ldflags = levels(cpp_compiler, min_optimize)
        return ["O1" if flag == "O3" else flag for flag in cflags], ldflags
    cpp_builder._get_optimization_cflags = lower


class _LowerWhenImported(importlib.abc.MetaPathFinder):
    """Lowers cpp_builder's levels the moment it is imported: importing inductor costs ~1.8 s, which a test
    process (or the session's controller) that builds nothing need not pay."""

    NAME = "torch._inductor.cpp_builder"

    def find_spec(self, fullname, path, target=None):
        if fullname != self.NAME:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _lower_levels(module)
        spec.loader.exec_module = exec_module
        return spec


def _packages_built_for_checking() -> None:
    """The packages the tests build are run for a few steps of tiny models, to check what they compute: their C++
    is compiled at -O1 (kernels; inductor's -O3) and -O0 (the wrapper; its -O1), which takes ~15 % less of a build.
    Only this test session: users' builds keep inductor's levels. (Subprocesses get the wrapper's level only.)"""
    os.environ.setdefault("AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL", "O0")   # read by inductor's config at import
    if "torch._inductor.config" in sys.modules:
        from torch._inductor import config

        config.aot_inductor.compile_wrapper_opt_level = os.environ["AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL"]
    if _LowerWhenImported.NAME in sys.modules:
        _lower_levels(sys.modules[_LowerWhenImported.NAME])
    else:
        sys.meta_path.insert(0, _LowerWhenImported())


def _few_rows_gemms_untimed() -> str:
    """FEW's settings let inductor time its C++ GEMM against ATen's for each product (a candidate library compiled
    per product, ~4 s each): the tests check what packages compute, not which product wins, so they take ATen's
    without timing, unless a test asks for `timed_gemms`. Returns FEW's own choice of backends."""
    from glassformer.inference import compiler

    users = compiler.FEW["max_autotune_gemm_backends"]
    compiler.FEW["max_autotune_gemm_backends"] = "ATEN"
    return users


_packages_built_for_checking()
USERS_GEMM_BACKENDS = _few_rows_gemms_untimed()


@pytest.fixture
def timed_gemms(monkeypatch):
    """FEW's GEMMs timed as users' builds time them (inductor's C++ GEMM or ATen's): for packages that processes
    outside this session (a command's workers) must find by the same recipe."""
    from glassformer.inference import compiler

    monkeypatch.setitem(compiler.FEW, "max_autotune_gemm_backends", USERS_GEMM_BACKENDS)


@pytest.fixture
def timed_gemms_on_amx(request):
    """Where the CPU has AMX, `timed_gemms`: inductor's C++ GEMM, the choice that puts AMX kernels in a package, is
    built and can win; elsewhere untimed like the rest of the session."""
    if torch.cpu._is_amx_tile_supported():
        request.getfixturevalue("timed_gemms")


@pytest.fixture(autouse=True, scope="session")
def _compiled_packages_stay_in_the_session(tmp_path_factory):
    """Compiled decoding steps go to a folder of this session, not the user's cache; `--compile auto` builds
    none for a long job (a build costs tens of seconds: the tests that are about compiling ask for it)."""
    from glassformer.decoding import translator
    from glassformer.inference import compiler

    saved = os.environ.get(compiler.CACHE_ENV), translator.AUTO_MIN_SENTENCES, compiler._USER_FOLDER
    compiler._USER_FOLDER = str(tmp_path_factory.mktemp("compiled"))      # as if the user had set the variable
    compiler.use_compile_cache()
    translator.AUTO_MIN_SENTENCES = 10 ** 9
    yield
    translator.AUTO_MIN_SENTENCES, compiler._USER_FOLDER = saved[1:]
    if saved[0] is None:
        os.environ.pop(compiler.CACHE_ENV, None)
    else:
        os.environ[compiler.CACHE_ENV] = saved[0]


@pytest.fixture(scope="session")
def shared_packages(_compiled_packages_stay_in_the_session) -> Path:
    """The session's one folder of compiled packages (`compiler.cache_folder()`): a package is named by what it
    computes, so tests that need the same one (a model, a search, a thread count) build it once and share it."""
    from glassformer.inference import compiler

    return compiler.cache_folder()


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    """Every test starts from the same seeds and one intra-op thread (code under test may change it)."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(1)


def _train_tiny(tmp_path_factory, *extra: str):
    """A run folder of the tiny preset (seconds on a CPU), trained with `extra` flags."""
    import argparse

    from glassformer.training.commands import add_train_arguments
    from glassformer.training.loop import train

    out = tmp_path_factory.mktemp("tiny") / "run"
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    args = parser.parse_args(["--preset", "tiny", *extra, "--no-eval", "--quiet", "--threads", "1", "--out", str(out)])
    assert train(args) == 0
    torch.set_num_threads(1)
    return out


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The tiny preset trained in full (about 15 s), shared by the tests that need trained weights."""
    return _train_tiny(tmp_path_factory)


@pytest.fixture(scope="session")
def short_tiny_run(tmp_path_factory):
    """The tiny preset on 120 pairs for 2 epochs (a few seconds)."""
    return _train_tiny(tmp_path_factory, "--limit", "120", "--epochs", "2")


def _slow_as_a_whole(path: Path) -> bool:
    """A test file whose module mark is `slow` (`pytestmark = ... slow`), read from its text, not imported."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return False
    return re.search(r"^pytestmark\s*=[^\n]*\bmark\.slow\b", text, re.MULTILINE) is not None


def pytest_ignore_collect(collection_path, config):
    """The fast tier (`-m "not slow"`) does not import the files it would deselect whole: some import transformers,
    inseq or Playwright (~4 s in every test process)."""
    if config.option.markexpr.strip() == "not slow" and collection_path.suffix == ".py" \
            and collection_path.name.startswith("test_") and _slow_as_a_whole(collection_path):
        return True
    return None
