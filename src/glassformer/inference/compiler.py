"""The model's own decoding step, compiled ahead of time (docs/performance.md): the C++ compiler it needs, the build
(or, `build` False, only the packages built before), the package's name and the folder packages are kept in.

    decoder = CompiledDecoder(model, step, cache_folder(None), notes=print, steps=steps)   # decoding/search.py's
    generate(model, src, BeamSearch(4), compiled=decoder)

`torch.export` traces, AOTInductor builds `Source` (the encoder, each layer's `project_kv`) and `Step` (search.py's
`step`, or greedy's k `steps` a call, on `prepare(model, onednn=False, path="glass", transposed=True)`) per beam, each
also for FEW_ROWS rows; named by what they compute, written whole, run `unpacked` (paths.py); failing: a note, eager."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import math
import os
import platform
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from ..model.cache import GROW, KVCache
from ..model.transformer import Transformer
from ..paths import unpacked, write_whole
from .precision import cpu_precision_support, precision_of
from .prepare import MKL, ONEDNN, packs_left_out, prepare

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
PACKAGES = "packages"          # below the cache folder: the .pt2 packages
MAX_LEN = 512                  # longer max_len: decoded eagerly
WEIGHT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8}   # compiled: weights
MAX_ROWS, FEW_ROWS = 1 << 14, 4   # rows a package accepts (sentences x beam); a "-few" package: at most 4
PACKED_ROWS = (8, 16, 32, 64)     # greedy's many-row steps on MKL's packs: a package for each of these row counts
STEPS = {"few": 1, "many": 1}     # greedy's steps a call (search.py `steps`) at a few rows / many: benchmarks/kstep.py
TYPICAL = {"slots": 32, "source": 12, "positions": 47, "limit": 34}   # a batch's sizes: a many-row step's build
FROZEN = {"freezing": True}     # weights frozen: products on oneDNN's blocked copy (MKL where faster: `prepacks`)
UNFROZEN = {"freezing": False}  # weights as the graph's parameters: every product an MKL addmm, nothing packed
FEW = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",   # a few rows, bf16, int8:
       "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}   # inductor's GEMMs, timed
_USER_FOLDER = os.environ.get(CACHE_ENV)   # the user's choice, read before inductor sets its own default


def cxx_compiler() -> str | None:
    """The C++ compiler inductor would use ($CXX, else c++ / g++ / clang++ on PATH), or None."""
    names = ([os.environ["CXX"]] if os.environ.get("CXX") else []) + ["c++", "g++", "clang++"]
    return next(filter(None, map(shutil.which, names)), None)


def cache_folder(folder: str | os.PathLike | None = None) -> Path:
    """`folder`, else the user's TORCHINDUCTOR_CACHE_DIR, else $XDG_CACHE_HOME or ~/.cache /glassformer/inductor."""
    home = _USER_FOLDER or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "glassformer/inductor"
    return Path(home) if folder is None else Path(folder).expanduser()


def use_compile_cache(folder: str | os.PathLike | None = None) -> Path:
    """For an entry point: inductor's kernel cache goes to `cache_folder(folder)` (returned; nothing created)."""
    path = cache_folder(folder)
    os.environ[CACHE_ENV] = str(path)
    return path


def unsupported(model) -> str | None:
    """Why the compiled step does not run `model` (None when it does)."""
    if not isinstance(model, Transformer) or precision_of(model) not in WEIGHT_DTYPES \
            or model.head.weight.dtype != WEIGHT_DTYPES[precision_of(model)]:
        return "not a float32, bfloat16 or int8 (precision.py) encoder-decoder Transformer"
    if model.cfg.positions not in ("sinusoidal", "learned", "none") or model.cfg.max_len > MAX_LEN:
        return f"{model.cfg.positions} positions, max_len {model.cfg.max_len} (at most {MAX_LEN})"
    return None


class Source(nn.Module):
    """src (sent, src), src_pad (sent, src) True = PAD, index (rows,) the sentence of each row -> each decoder
    layer's cross-attention K, then V (rows, heads, src, d): the model's encoder and `project_kv` (once a sentence)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor, src_pad: Tensor, index: Tensor) -> tuple[Tensor, ...]:
        memory = self.model.encode(src, src_pad)                             # (sent, src, d)
        kv = [layer.cross_attention.project_kv(memory) for layer in self.model.decoder.layers]   # once a sentence,
        return (*[k.index_select(0, index) for k, _ in kv], *[v.index_select(0, index) for _, v in kv])   # then rows


class Step(nn.Module):
    """decoding/search.py's `step` over tensors: the `Slots`, `pos` (0-dim) the tokens' position, alpha, src_pad
    (rows, src), the cache's buffers (flat) -> the `Advance`, then the self-attention K, V buffers (beams: new ones)."""

    def __init__(self, model: Transformer, step: Callable, search) -> None:
        super().__init__()
        self.model, self.step, self.search = model, step, search
        self.selfs = [layer.self_attention for layer in model.decoder.layers]
        self.crosses = [layer.cross_attention for layer in model.decoder.layers]

    def forward(self, tokens, scores, limits, live, worst, history, pos: Tensor, alpha: Tensor, src_pad: Tensor,
                joined: Tensor, *buffers: Tensor) -> tuple:          # buffers: self K, self V, cross K, cross V
        n = len(self.selfs)                                          # (a layer each)
        self_k, self_v, cross_k, cross_v = (buffers[i * n: (i + 1) * n] for i in range(4))
        cache = KVCache(position=pos, joined=joined, k=dict(zip(self.selfs, self_k, strict=True)),
                        v=dict(zip(self.selfs, self_v, strict=True)),
                        cross={a: kv for a, *kv in zip(self.crosses, cross_k, cross_v, strict=True)})
        out = self.step(self.model, self.search, cache, None, src_pad, (tokens, scores, limits, live, worst, history),
                        pos + 1, alpha)
        return (*out, *cache.k.values(), *cache.v.values())


class CompiledDecoder:
    """One model's packages, built (`build` False: only found) or loaded on first use, else after a note run eagerly.
    `threads`: a step's loops are made for them, a build per count; the many-row source side's for one."""

    def __init__(self, model: Transformer, step: Callable, folder: Path, notes: Callable[[str], None] | None = None,
                 threads: int | None = None, steps: Callable | None = None) -> None:
        self.model, self.step_fn, self.folder, self.notes = model, step, folder, notes or (lambda line: None)
        self.steps_fn, self.per_call, self.k, self.build = steps, STEPS, {}, True   # k: (search kind, rows) -> k
        self.selfs = [layer.self_attention for layer in model.decoder.layers]     # the cache's keys
        self.threads, self.narrow = threads or torch.get_num_threads(), precision_of(model) != "float32"
        self.positions = tuple(torch.tensor(i) for i in range(2 * model.cfg.max_len))   # a step's `pos`: columns
        self.parts, self.fewest = {}, {}      # "source" / "beam4" -> package; search kind -> its fewest slots (not 1)
        self._weights: str | None = None                                     # with the code's: a hash, once (_note)

    @functools.cached_property        # traced: W^T products, attention written out (inductor fuses it; SDPA an
    def fast(self) -> Transformer:    # extern call per layer); a copy (~0.1 s) made at a trace or MKL packs' load only
        fast = prepare(self.model, onednn=False, path="glass", direct=False, transposed=True)
        for embed in [e for e in (fast.src_embed, fast.tgt_embed) if e.sinusoidal]:            # before tracing
            embed.position_table(torch.float32, embed.token.weight.device)
        return fast

    def source(self, cache: KVCache, src: Tensor, src_pad: Tensor, index: Tensor) -> None:
        """Each decoder layer's cross-attention K/V for the rows `index`, into `cache`."""
        inputs = [src, src_pad, index]
        out = self._part("source" + ("-few" if src.size(0) <= FEW_ROWS else ""), None, inputs)(inputs)
        layers = [layer.cross_attention for layer in self.model.decoder.layers]
        cache.cross = {a: (k, v) for a, k, v in zip(layers, out[:len(layers)], out[len(layers):], strict=True)}

    def step(self, cache: KVCache, search, slots: tuple, length: int, alpha: Tensor, src_pad: Tensor,
             k: int = 1) -> tuple | None:
        """The step making `length` tokens: an `Advance`'s fields; k > 1: `steps`' k from it (None when its package
        cannot be had: a step a call from then on). The cache takes the new buffers."""
        if not cache.k:                                                      # the first step: zeroed buffers
            kv = next(iter(cache.cross.values()))[0]
            for a in self.selfs:
                cache.k[a] = kv.new_zeros(kv.size(0), a.heads, cache.capacity, a.d_k)
                cache.v[a] = kv.new_zeros(kv.size(0), a.heads, cache.capacity, a.d_v)
        end = min(cache.length + k, self.model.cfg.max_len)                # positions written (past it: held)
        if end > cache.k[self.selfs[0]].size(2):                            # full (every buffer alike): grow
            cache.reserve(end - cache.length)
        cross = cache.cross.values()                                         # inputs in Step.forward's order
        inputs = [*slots, self.positions[length - 1], alpha, src_pad, cache.joined, *cache.k.values(),
                  *cache.v.values(), *[k for k, _ in cross], *[v for _, v in cross]]
        kind = (search.kind, slots[0].size(0), k)
        part = self.parts.get(kind) or self._part(kind, search, inputs)
        if part is None:                                                     # a block that did not build
            self.k[kind[:2]] = 1
            return None
        out = part(inputs)
        n, layers = len(out) - 2 * len(self.selfs), len(self.selfs)
        cache.k, cache.v = (dict(zip(self.selfs, out[i: i + layers], strict=True)) for i in (n, n + layers))
        cache.advance(k)
        return out[:n]

    def steps_per_call(self, search, rows: int) -> int:
        """k: the steps a call makes at `rows` rows: `per_call`'s for greedy without scores (`steps` given), else 1."""
        k = self.per_call["few" if rows <= FEW_ROWS else "many"] if self.steps_fn and search.kind == "greedy" else 1
        return self.k.setdefault((search.kind, rows), k)

    def built(self, search, sentences: int = 0) -> bool:
        """Whether a step of `search` was built (greedy's few rows, TYPICAL's; `sentences`: a batch's, its source)."""
        K = search.beam
        rows = [sentences * K] if sentences else [FEW_ROWS] * (K == 1) + [TYPICAL["slots"] * K]
        return any(self._found(self._kind(search, r, self.steps_per_call(search, r))[0], search) for r in rows) \
            and (not sentences or bool(self._found("source" + "-few" * (sentences <= FEW_ROWS), None)))

    def _kind(self, search, rows: int, k: int = 1) -> tuple[str, int | None]:
        """A step's package over `rows` rows ("-k<k>": k a call), the rows it is traced for (None: any): greedy's
        few-row one, greedy's at each of PACKED_ROWS on MKL's packs (traced for that count), else the search's."""
        block = f"-k{k}" if k > 1 else ""
        if search.beam == 1 and rows in PACKED_ROWS and MKL and not self.narrow \
                and (k > 1 or not prepacks(self.model, self.threads, self.folder)):   # a block: one W for k steps
            return f"{search.kind}-{rows}{block}", rows
        if search.beam == 1 and rows <= FEW_ROWS:
            return f"{search.kind}-few{block}", None
        return search.kind + block, None

    def _part(self, kind: str | tuple, search, inputs: list) -> Callable:
        """The package of `kind` ("source(-few)", a step's (search kind, rows, k): `_kind`), a function of the flat
        inputs: found, else traced, named, built; loaded (on any failure: the module, one note; a block: None)."""
        name, rows = (kind, None) if search is None else self._kind(search, *kind[1:])
        if name not in self.parts:
            self.parts[name] = self._build(name, search, inputs, rows, 1 if search is None else kind[2])
        self.fewest.update({search.kind: min(PACKED_ROWS)} if rows else {})   # on MKL's packs: performance.md
        self.parts[kind] = self.parts[name]
        return self.parts[kind]

    def _build(self, kind: str, search, inputs: list, rows: int | None, k: int = 1) -> Callable | None:
        beam, few = 0 if search is None else search.beam, "-few" in kind
        step = functools.partial(self.steps_fn, k=k) if k > 1 else self.step_fn          # search.py's, or k `steps`
        module = functools.cache(lambda: Source(self.fast) if search is None else Step(self.fast, step, search))
        what = (f"{k} steps" if k > 1 else "the step") + f" for beam {beam}" if beam else "the source side"
        what += f" ({rows or 'a few'} rows)" if few or rows else ""
        try:
            path = self._found(kind, search)
            if path is None and not self.build:                      # "load": no build (a block: a step a call)
                if k == 1:
                    self.notes(f"--compile auto: {what} not built (--compile on builds it); decoding it eagerly")
                return None if k > 1 else lambda flat: module()(*flat)
            if path is None:                                         # the products' route asked only to build
                configs = self._configs(kind, k == 1 and (self.narrow or few and kind != "source-few" or prepacks(
                    self.model, self.threads, self.folder)))   # a block unfrozen: frozen, each step packs its own W
                example, dynamic = _shapes(inputs, beam, self.model.cfg.max_len, few, rows)
                with torch.no_grad(), packs_left_out(module()):
                    program = torch.export.export(module(), example, dynamic_shapes=dynamic)
                path = self.folder / PACKAGES / f"{kind}-{package_name(program, configs)}.pt2"
                if not path.exists():
                    self.notes(f"--compile: building {what} (once per model; later runs load it from {path.parent})")
                    began = time.perf_counter()
                    if write_whole(path, lambda partial: torch._inductor.aoti_compile_and_package(
                            program, package_path=str(partial), inductor_configs=configs)):   # else: another's
                        self.notes(f"--compile: built in {time.perf_counter() - began:.1f} s")
                write_whole(self._note(kind, search), lambda partial: partial.write_text(path.name), replace=True)
            return _load(path, lambda: {name: p for name, p in module().named_parameters() if name.endswith(".mkl")})
        except Exception as error:                                           # no working toolchain, a bad package
            first = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
            self.notes(f"compiling {what} failed ({type(error).__name__}: {first}); "
                       + ("one step a call" if k > 1 else "decoding eagerly"))
            return None if k > 1 else lambda flat: module()(*flat)

    def _configs(self, kind: str, onednn: bool = True) -> dict:
        """inductor's settings for `kind`: many-row source 1 thread; bf16 / int8, few rows: FEW's GEMMs, else oneDNN's
        frozen weights; off oneDNN's route (`prepacks`, asked at a build, not for a note) MKL's, unfrozen."""
        base = (FEW if "-few" in kind or self.narrow else FROZEN) if onednn else UNFROZEN
        return {**base, "cpp.threads": 1 if kind == "source" else self.threads}

    def _found(self, kind: str, search) -> Path | None:       # the package the same recipe named, if still there
        note = self._note(kind, search)
        path = note.parent / note.read_text().strip() if note.exists() else note
        return path if path.suffix == ".pt2" and path.exists() else None

    def _note(self, kind: str, search) -> Path:
        """Where the recipe of `kind` (weights, code bytes, strategy, build) names its package: skips a trace."""
        if self._weights is None:                                            # once: the weights, the code's bytes
            h, root = _tensors(hashlib.sha256(), self.model.state_dict()), Path(__file__).resolve().parents[1]
            for name in sorted([*root.glob("model/*.py"), *root.glob("inference/*.py"), *root.glob("decoding/*.py")]):
                h.update(name.read_bytes())
            self._weights = h.hexdigest()
        configs = self._configs(kind)
        h = hashlib.sha256(json.dumps([self._weights, repr(self.model.cfg), _machine(configs["cpp.threads"]),
                                       sorted(configs.items()), repr(type(search))]).encode())
        return self.folder / PACKAGES / f"{kind}-{h.hexdigest()[:24]}.name"


def prepacks(model: Transformer, threads: int, folder: Path) -> bool:
    """Whether a step's products run faster on oneDNN's pre-blocked weights than on MKL (its packs where torch has them)
    at `threads`, the current count (else oneDNN where present): the model's own `decode_step` on two prepared copies
    (8 steps of TYPICAL rows, alternating, best of 5), timed once, kept (AMD Zen 4: oneDNN; Xeon with AMX: MKL)."""
    if not ONEDNN or threads != torch.get_num_threads():
        return ONEDNN
    key = json.dumps([_machine(threads), sorted(cpu_precision_support().flags), repr(model.cfg), "packs"]).encode()
    path = folder / PACKAGES / f"products-{hashlib.sha256(key).hexdigest()[:24]}.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):      # not timed yet, or a damaged file
        timings = json.loads(path.read_text())
        return float(timings["onednn_s"]) <= float(timings["mkl_s"])
    with torch.random.fork_rng(devices=[]):                                 # the caller's random numbers untouched
        copies, best = [prepare(model), prepare(model, onednn=False, transposed=True)], [math.inf] * 2
        rows, tokens = TYPICAL["slots"], torch.full((TYPICAL["slots"], 1), model.cfg.bos_id)
        memory = torch.randn(rows, TYPICAL["source"], model.cfg.d_model)                # (rows, src, d)
        for _, (i, fast) in itertools.product(range(5), enumerate(copies)):
            cache, began = fast.new_cache(), time.perf_counter()
            for _ in range(8):
                fast.decode_step(tokens, memory, None, cache)
            best[i] = min(best[i], time.perf_counter() - began)
    write_whole(path, lambda part: part.write_text(json.dumps({"onednn_s": best[0], "mkl_s": best[1]})), replace=True)
    return best[0] <= best[1]


def _machine(threads: int) -> dict:
    return {"torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability(), "machine": platform.machine(),
            "threads": threads, "profiled": os.environ.get("TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE") == "1"}


def package_name(program: torch.export.ExportedProgram, configs: dict) -> str:
    """A hash of what a package computes: the exported graph (no source lines or paths), its sizes' ranges, weights
    and constants, the build's inductor settings (threads included), its example sizes, torch and the CPU."""
    sizes = [list(t.shape) for t in torch.utils._pytree.tree_leaves(program.example_inputs)]
    h = hashlib.sha256(json.dumps([_machine(configs["cpp.threads"]), sorted(configs.items()), sizes]).encode())
    h.update(str(program.graph).encode())
    h.update(str(sorted((str(k), str(v)) for k, v in program.range_constraints.items())).encode())
    return _tensors(h, {**program.state_dict, **program.constants}).hexdigest()[:24]


def _tensors(h, named: dict):
    """`h` updated with each tensor's name, shape, dtype and bytes."""
    for name, t in sorted((n, t) for n, t in named.items() if isinstance(t, Tensor) and not t.is_mkldnn):
        h.update(f"{name} {tuple(t.shape)} {t.dtype}".encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h


def _load(path: Path, packs: Callable[[], dict[str, Tensor]]) -> Callable:
    """A package as a function of its flat input tensors -> a list of tensors, `packs()` ours: run `unpacked`."""
    torch.cpu._init_amx()       # AMX kernels need the process's AMX state: inductor asks at a build, not at a load
    with unpacked(path, ".so") as so:
        runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(so), 1)
    wanted = {fqn: name for name, fqn in runner.get_constant_names_to_original_fqns().items() if fqn.endswith(".mkl")}
    if not set(wanted) <= (packs := packs() if wanted else {}).keys():      # a stand-in left: MKL would not run
        raise RuntimeError(f"the package wants MKL packs the model lacks ({sorted(set(wanted) - packs.keys())[0]})")
    runner.update_constant_buffer({wanted[fqn]: packs[fqn] for fqn in wanted}, False, False, True)   # for stand-ins
    return runner.run


def _shapes(inputs: list, beam: int, max_len: int, few: bool = False, rows: int | None = None) -> tuple[tuple, tuple]:
    """Inputs like `inputs` (Source's for beam 0, else Step's, flat), every size symbolic, and those sizes: sentences
    or slots, rows (slots x beam; `few`: at most FEW_ROWS), source, output limit (and a block's columns past it),
    self-attention positions. Example sizes 2 or 3 (above 1: kept symbolic), a many-row step's a batch's (TYPICAL)."""
    Dim = torch.export.Dim
    typical = beam > 0 and not few
    n = {k: max(2, min(v, max_len - 1)) for k, v in TYPICAL.items()} if typical else dict.fromkeys(TYPICAL, 2)
    n["slots"] = n["slots"] if rows is None else rows // beam
    source = (n["source"] + 1, Dim("source", min=1, max=max_len))
    if beam == 0:
        sentences = (n["slots"], Dim("sentences", min=1, max=MAX_ROWS))
        specs = [{0: sentences, 1: source}] * 2 + [{0: (n["slots"] + 1, Dim("rows", min=1, max=MAX_ROWS))}]
    else:
        slots = Dim("slots", min=1, max=(FEW_ROWS if few else MAX_ROWS) // beam) if rows is None else Dim.STATIC
        slot, rows = (n["slots"], slots), (n["slots"] * beam, slots if beam == 1 else beam * slots)
        positions = (n["positions"] + 1, Dim("positions", min=1, max=2 * max_len + GROW))   # columns, as rows
        limit = (n["limit"] + 1, Dim("limit", min=1, max=3 * max_len + max(STEPS.values())))   # join (joining.py)
        layers = (len(inputs) - 10) // 4                                     # self K, V; cross K, V: a layer each
        specs = [{0: rows}, *[{0: slot}] * 4, {0: rows, 1: limit}, {}, {}, {0: rows, 1: source}, {0: rows},
                 *[{0: rows, 2: positions}] * 2 * layers, *[{0: rows, 2: source}] * 2 * layers]
    example = [t.new_zeros([spec[d][0] if d in spec else n for d, n in enumerate(t.shape)]) if spec else t
               for t, spec in zip(inputs, specs, strict=True)]
    dims = [{d: s[1] for d, s in spec.items()} or None for spec in specs]
    if beam == 0:                                                            # ids; the rows' sentences
        example[0], example[2] = example[0] + 5, torch.arange(n["slots"] + 1) % n["slots"]
        return tuple(example), tuple(dims)
    example[2] = example[2] + 3                                              # output limits
    return tuple(example), (*dims[:10], tuple(dims[10:]))                    # Step's *buffers: one group
