"""The race: one trained model, translated by glassformer, CTranslate2 and transformers' Marian.

    python -m benchmarks.race --run RUN_DIR --ct2 CT2_DIR --hf HF_DIR            # the full race
    python -m benchmarks.race --run RUN_DIR --ct2 CT2_DIR --hf HF_DIR --quick    # a smoke run, a minute or two

RUN_DIR is a glassformer run folder; CT2_DIR and HF_DIR are its exports (`glassformer export --to ctranslate2`,
`--to transformers`): a `ctranslate2.Translator` directory and a `MarianMTModel.from_pretrained` directory,
each with source_tokenizer.json / target_tokenizer.json. Either export may be left out (its systems are skipped).

The same work for every system: the HSK test and Tatoeba held-out sentences, segmented once by the run's own
source tokenizer, so every system reads the same source ids (the exports keep glassformer's ids; the driver
counts the sentences where an export's source_tokenizer.json would give other ids). Each system decodes
them in the batches it does best (glassformer and Marian: sorted by length, then chunks; CTranslate2: the
whole list with `max_batch_size`, which sorts by length inside), at most 2 x source length + 10 tokens.
Outputs are target ids, detokenized by the run's target tokenizer for sacreBLEU, and compared with
glassformer float32's: the report counts the outputs that differ, so no system wins by doing less.

Systems: glassformer float32 / compiled (float32 on the compiled decoding step, glassformer.inference.compiler;
with --compiled; every row bucket run once before the timed rounds) / compiled-full (the same, a beam search stopped
by CTranslate2's rule with a length penalty: once K hypotheses are in, stop="full", decoding/search.py) /
compiled-inter (with more than one thread: the compiled step in `--threads` worker processes, one thread each,
`Translator.workers`, decoding/workers.py; started and warmed before the timed rounds) / compiled-bfloat16 and
compiled-bfloat16-inter (the same two layouts for the bfloat16 copy: its products on inductor's GEMMs, AMX where the
CPU has it) / compiled-int8 and compiled-int8-inter (the int8 copy, its products on `torch._int_mm`) / bfloat16 /
int8 (glassformer.inference.precision, eagerly),
CTranslate2 compute_type float32 / int8 / bfloat16 (those `ctranslate2.get_supported_compute_types("cpu")`
lists), each in two thread layouts: one batch at a time on `--threads` intra-op threads, and (with more than one
thread) `-inter`: `--threads` batches at a time on one thread each (its `inter_threads`, the layout CTranslate2
documents for throughput; on some hosts its intra-op threads run slower than one, docs/performance.md), Marian
float32 and bfloat16 autocast. Each runs in its own process (its peak RSS is that process's
ru_maxrss, with the RSS after loading beside it); rounds are interleaved (each round runs every system once
per case, the order rotating), and ratios are taken round by round. A plain matrix product at each precision, timed in
the same run with the same threads, is the roofline; the CPU's flags are in the report.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .pipe import WAIT_POLICIES, JsonWorker, child_env

HERE = Path(__file__).resolve().parent
ALPHA = 1.0                                   # beam length penalty: score / len^alpha, for every system
LENGTH_A, LENGTH_B = 2, 10                    # output limit: 2 x source length + 10 tokens (glassformer's)
QUALITY_BLEU = 0.3                            # a precision holds quality within this much BLEU of float32
BASELINE = "glassformer/float32"
GLASSFORMER = ("float32", "bfloat16", "int8")
COMPILED = "glassformer/compiled"             # float32 on the compiled decoding step (after the precisions)
COMPILED_RULE = "glassformer/compiled-full"    # the same, a beam search stopped by CTranslate2's rule (stop="full")
INTER = "-inter"                              # batches in parallel, a thread each (CTranslate2's inter_threads)
COMPILED_INTER = COMPILED + INTER             # the compiled step in --threads worker processes (Translator.workers)
COMPILED_BF16 = COMPILED + "-bfloat16"        # the bfloat16 copy (precision.py) on its compiled step
COMPILED_INT8 = COMPILED + "-int8"            # the int8 copy (precision.py) on its compiled step
CT2_TYPES = ("float32", "int8", "bfloat16")
FLOAT32 = ("glassformer/float32", COMPILED, COMPILED_RULE, COMPILED_INTER)   # glassformer's float32 systems
HF_TYPES = ("float32", "bfloat16")
ROOFLINE_SHAPES = ((2048, 2048, 2048), (32, 256, 1024))     # (m, k, n): a large product, the decoder's own
QUICK_ROOFLINE_SHAPES = ((1024, 1024, 1024), (32, 256, 1024))


@dataclass(frozen=True)
class Case:
    name: str
    beam: int
    batch: int
    sentences: int | None = None              # the first N sentences only (batch 1 is slow for some)

    def as_dict(self) -> dict:
        return {"name": self.name, "beam": self.beam, "batch": self.batch, "sentences": self.sentences}


def cases(quick: bool, b1_sentences: int) -> list[Case]:
    b1 = min(b1_sentences, 16) if quick else b1_sentences
    return [Case("greedy-b1", 1, 1, b1), Case("greedy-b32", 1, 32), Case("beam4-b32", 4, 32)]


# ---- pieces every system shares ---------------------------------------------------------------------

def sorted_batches(lengths: Sequence[int], size: int) -> list[list[int]]:
    """Indices sorted by length (ties in input order), in chunks of at most `size`: little padding."""
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[i: i + size] for i in range(0, len(order), size)]


def output_limit(lengths: Sequence[int], cap: int) -> int:
    """Most tokens one call may generate for sources of these lengths: 2 x longest + 10, at most `cap`."""
    return min(cap, LENGTH_A * max(lengths, default=0) + LENGTH_B)


def gemm_flops(m: int, k: int, n: int) -> int:
    """Floating-point operations of an (m, k) by (k, n) product: one multiply and one add per term."""
    return 2 * m * k * n


def count_differences(outputs: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> int:
    """How many outputs are not exactly the reference's ids."""
    if len(outputs) != len(reference):
        raise ValueError(f"{len(outputs)} outputs against {len(reference)} reference outputs")
    return sum(list(a) != list(b) for a, b in zip(outputs, reference, strict=True))


def rss_mb() -> float:
    """This process's peak resident set size so far, in MiB: VmHWM of /proc/self/status on Linux (ru_maxrss
    there keeps the forking parent's peak across exec, so every worker would report the driver's), else
    ru_maxrss (KiB on Linux, bytes on macOS)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024                           # kB
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


# ---- the systems (each in its own worker process) -----------------------------------------------------

class Glassformer:
    """A glassformer run folder at one precision: float32 on the fast path (eager, or "compiled": the model's
    step as packages, built or loaded and every row bucket run before the first timed call; "compiled-full": the
    same with stop="full", CTranslate2's rule), bf16/int8 via with_precision."""

    def __init__(self, model, dtype: str, threads: int) -> None:
        from glassformer.inference.precision import with_precision
        self.threads, self.pad_id = threads, model.cfg.pad_id
        self.warm: set[tuple[int, int]] = set()
        self.stop = {}                                           # generate's default stopping rule
        if dtype == "compiled-full":                             # CTranslate2's rule (decoding/search.py)
            dtype, self.stop = "compiled", {"stop": "full"}
        self.compiled = self.translator = None
        precision = next((p for p in ("bfloat16", "int8") if dtype.startswith(f"compiled-{p}")), "float32")
        dtype = dtype.replace(f"-{precision}", "")
        if dtype == "compiled-inter":                            # the Translator's worker processes
            from glassformer.decoding.translator import Translator
            from glassformer.inference.compiler import cache_folder, use_compile_cache

            use_compile_cache()
            self.translator = Translator(model, None, None, compile="on", compile_cache=str(cache_folder()),
                                         notes=lambda line: print(line, file=sys.stderr))
            self.translator.workers, self.translator.precision = threads, precision
        elif dtype == "compiled":
            from glassformer.decoding.search import step
            from glassformer.inference.compiler import CompiledDecoder, cache_folder, use_compile_cache

            use_compile_cache()                                  # TORCHINDUCTOR_CACHE_DIR or the user cache
            self.decoder = with_precision(model, precision)
            self.compiled = CompiledDecoder(self.decoder, step, cache_folder(), threads=threads)   # beams: for them
        else:
            self.decoder = _fast(model) if dtype == "float32" else with_precision(model, dtype)

    @classmethod
    def load(cls, run: str, dtype: str, threads: int) -> Glassformer:
        from glassformer.data.checkpoint import load_translator_parts
        return cls(load_translator_parts(run)[0], dtype, threads)

    def translate(self, sources: list[list[int]], beam: int, batch: int) -> list[list[int]]:
        from glassformer.data.batching import padded
        from glassformer.decoding.search import generate, strategy
        from glassformer.inference import decoding_threads, use_threads
        if self.translator is not None:
            return self._in_workers(sources, beam, batch)
        out: list[list[int]] = [[] for _ in sources]
        search = strategy(beam, scores=False)             # ids only, as CTranslate2 without return_scores
        with use_threads(decoding_threads(batch * beam, self.threads)):
            self._compile_buckets(sources, search, batch)
            for chunk in sorted_batches([len(s) for s in sources], batch):
                src = padded([sources[i] for i in chunk], self.pad_id)                         # (batch, longest)
                found = generate(self.decoder, src, search, alpha=ALPHA, compiled=self.compiled, **self.stop)
                for i, hyps in zip(chunk, found, strict=True):
                    out[i] = hyps[0].tokens
        return out


    def _in_workers(self, sources: list[list[int]], beam: int, batch: int) -> list[list[int]]:
        """The Translator's worker processes; at the first call of a (beam, batch), untimed in the race's
        warm-up, each worker starts and runs every row bucket up to `batch` (two tokens)."""
        from glassformer.decoding.search import SENTENCE_BUCKETS
        if (beam, batch) not in self.warm and sources:
            self.warm.add((beam, batch))
            one = next((s for s in sources if s), [self.pad_id + 1])
            for n in [b for b in SENTENCE_BUCKETS if b < batch] + [batch]:     # a batch of n for each worker
                self.translator.batch_size = n
                self.translator.translate_ids([one] * (n * self.translator.workers), beam, ALPHA, max_length=2)
            if self.translator._workers is None:
                raise RuntimeError("the decoding workers did not start")
        self.translator.batch_size = batch
        return self.translator.translate_ids(sources, beam, ALPHA)

    def _compile_buckets(self, sources: list[list[int]], search, batch: int) -> None:
        """Compiled decoder: run every row bucket up to `batch` once (two tokens), so no timed call compiles."""
        from glassformer.data.batching import padded
        from glassformer.decoding.search import SENTENCE_BUCKETS, generate
        if self.compiled is None or (search.beam, batch) in self.warm or not sources:
            return
        self.warm.add((search.beam, batch))
        for n in [b for b in SENTENCE_BUCKETS if b < batch] + [batch]:
            src = padded([sources[i % len(sources)] or [self.pad_id + 1] for i in range(n)], self.pad_id)
            generate(self.decoder, src, search, alpha=ALPHA, max_len=2, compiled=self.compiled)


def _fast(model):
    """glassformer's eager float32 decoder, as `translate --compile off` runs it: the model's own decode_step
    on its prepared copy."""
    from glassformer import inference
    return inference.prepare(model)


class TokenMap:
    """ids <-> tokens of an export's tokenizers JSON (the exports keep glassformer's ids)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer
        self.tokenizer = Tokenizer.from_file(str(path))
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        self.tokens = {i: t for t, i in vocab.items()}
        self.ids = vocab

    def to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.tokens[i] for i in ids]

    def to_ids(self, tokens: Sequence[str], unknown: int) -> list[int]:
        return [self.ids.get(t, unknown) for t in tokens]


class CTranslate2:
    """A CTranslate2 export at one compute_type; the whole list in one call, sorted and batched by CT2: one batch
    at a time on `threads` threads, or (`inter`) `threads` batches at a time on one thread each."""

    def __init__(self, folder: str, compute_type: str, threads: int, cap: int, inter: bool = False) -> None:
        import ctranslate2
        self.translator = ctranslate2.Translator(folder, device="cpu", compute_type=compute_type,
                                                 inter_threads=threads if inter else 1,
                                                 intra_threads=1 if inter else threads)
        self.source = TokenMap(Path(folder) / "source_tokenizer.json")
        self.target = TokenMap(Path(folder) / "target_tokenizer.json")
        self.unknown = self.target.ids.get("<unk>", 0)
        self.cap = cap

    def translate(self, sources: list[list[int]], beam: int, batch: int) -> list[list[int]]:
        results = self.translator.translate_batch(
            [self.source.to_tokens(s) for s in sources], max_batch_size=batch, batch_type="examples",
            beam_size=beam, length_penalty=ALPHA, min_decoding_length=0,
            max_decoding_length=output_limit([len(s) for s in sources], self.cap))
        return [self.target.to_ids(r.hypotheses[0], self.unknown) for r in results]


def _ct2_cap(run: str) -> int:
    """CTranslate2's most decoding steps for the run's position table: max_len - 1 (it asks for one position
    more than glassformer, which never feeds the last token it generates; a longer limit stops the worker)."""
    return int(json.loads((Path(run) / "config.json").read_text())["model"]["max_len"]) - 1


class Marian:
    """A transformers MarianMTModel export, float32 or under bfloat16 autocast; sorted chunks of `batch`."""

    def __init__(self, folder: str, dtype: str, threads: int) -> None:
        import torch
        from transformers import MarianMTModel
        torch.set_num_threads(threads)
        self.torch, self.bf16 = torch, dtype == "bfloat16"
        self.model = MarianMTModel.from_pretrained(folder).eval()
        cfg = self.model.config
        self.pad, self.cap = cfg.pad_token_id, cfg.max_position_embeddings
        self.special = {cfg.pad_token_id, cfg.eos_token_id, cfg.decoder_start_token_id}

    def translate(self, sources: list[list[int]], beam: int, batch: int) -> list[list[int]]:
        torch = self.torch
        out: list[list[int]] = [[] for _ in sources]
        for chunk in sorted_batches([len(s) for s in sources], batch):
            rows = [sources[i] for i in chunk]
            width = max(len(r) for r in rows)
            ids = torch.tensor([r + [self.pad] * (width - len(r)) for r in rows])
            mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                gen = self.model.generate(input_ids=ids, attention_mask=mask, num_beams=beam, do_sample=False,
                                          length_penalty=ALPHA, max_new_tokens=output_limit([width], self.cap))
            for i, row in zip(chunk, gen.tolist(), strict=True):
                out[i] = [t for t in row[1:] if t not in self.special]    # drop the start token, EOS, padding
        return out


def build_system(name: str, args) -> object:
    family, dtype = name.split("/")
    if family == "glassformer":
        return Glassformer.load(args.run, dtype, args.threads)
    if family == "ctranslate2":
        return CTranslate2(args.ct2, dtype.removesuffix(INTER), args.threads, _ct2_cap(args.run), dtype.endswith(INTER))
    return Marian(args.hf, dtype, args.threads)


def worker(args) -> int:
    """Answer JSON lines on stdin: {"sources"} once, then {"beam", "batch", "sentences"} per run; {"quit"}."""
    system = build_system(args.worker, args)
    print(json.dumps({"ready": True, "rss_loaded_mb": rss_mb()}), flush=True)
    sources: list[list[int]] = []
    for line in sys.stdin:
        request = json.loads(line)
        if "quit" in request:
            break
        if "sources" in request:
            sources = request["sources"]
            reply = {"ok": True}
        elif "rss" in request:
            reply = {"rss_peak_mb": rss_mb()}
        else:
            work = sources[: request.get("sentences") or len(sources)]
            start = time.perf_counter()
            outputs = system.translate(work, request["beam"], request["batch"])
            reply = {"seconds": time.perf_counter() - start, "outputs": outputs, "rss_peak_mb": rss_mb()}
        print(json.dumps(reply), flush=True)
    return 0


def env_threads(name: str, threads: int) -> int:
    """OMP_NUM_THREADS / MKL_NUM_THREADS of a system's worker: its threads, but 1 for a CTranslate2 `-inter`
    system, whose batches run on a thread each (with both at 2, each of its 2 batches asked OpenMP and MKL for 2
    threads on 2 cores: greedy b32 at about half its rate, 14,627 against 28,923 tokens/s on a 2-core Xeon)."""
    return 1 if name.endswith(INTER) else threads


class WorkerProcess(JsonWorker):
    """One system in its own process (`--worker NAME`), in benchmarks.run's worker environment."""

    def __init__(self, name: str, args) -> None:
        cmd = [sys.executable, "-m", "benchmarks.race", "--worker", name, "--threads", str(args.threads)]
        for flag, value in (("--run", args.run), ("--ct2", args.ct2), ("--hf", args.hf)):
            if value:
                cmd += [flag, str(value)]
        env = child_env(env_threads(name, args.threads), wait_policy=args.omp_wait_policy)
        super().__init__(name, cmd, HERE.parent, env, {"quit": True})
        self.loaded = self.read()


# ---- the roofline -------------------------------------------------------------------------------------

def roofline(threads: int, seconds: float = 0.5, shapes=ROOFLINE_SHAPES, max_seconds: float = 20.0) -> list[dict]:
    """GFLOP/s of one plain product per shape and precision: fp32 and bf16 torch.mm; int8 the dynamically
    quantised linear glassformer's int8 runs (activation quantisation included). Shapes run smallest first;
    a product whose time, estimated from the smaller one's rate, is over `max_seconds` is skipped (a CPU
    without bf16/int8 instructions can be a hundred times slower than at float32)."""
    import torch
    from torch import nn

    from glassformer.inference import use_threads
    from glassformer.inference.precision import with_precision
    rows = []
    rate: dict[str, float] = {}                                   # FLOP/s measured so far, per dtype
    with use_threads(threads), torch.inference_mode():
        for m, k, n in sorted(shapes, key=lambda s: gemm_flops(*s)):
            a, b = torch.randn(m, k), torch.randn(k, n)
            a16, b16 = a.bfloat16(), b.bfloat16()
            int8 = with_precision(nn.Sequential(nn.Linear(k, n, bias=False)), "int8", note=False)
            runs = {"float32": lambda a=a, b=b: torch.mm(a, b),
                    "bfloat16": lambda a=a16, b=b16: torch.mm(a, b),
                    "int8": lambda a=a, lin=int8: lin(a)}
            flops = gemm_flops(m, k, n)
            for dtype, run in runs.items():
                row = {"m": m, "k": k, "n": n, "dtype": dtype, "gflops": None}
                estimate = flops / rate[dtype] if dtype in rate else 0.0
                if estimate > max_seconds:
                    row["skipped"] = f"about {estimate:.0f} s per product"
                else:
                    rate[dtype] = flops / _seconds_per_call(run, seconds)
                    row["gflops"] = rate[dtype] / 1e9
                rows.append(row)
    return rows


def _seconds_per_call(run, budget: float) -> float:
    """Seconds per call of `run`: the best of 3 timings of enough repeats to fill about a tenth of
    `budget`; a call that alone takes longer than `budget` is timed once."""
    start = time.perf_counter()
    run()                                                         # warm-up, and a first estimate
    first = time.perf_counter() - start
    if first >= budget:
        return first
    repeats = max(1, int(budget / 10 / max(first, 1e-9)))
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


# ---- the driver ----------------------------------------------------------------------------------------

def systems(args) -> list[str]:
    inter = [COMPILED_INTER, COMPILED_BF16 + INTER, COMPILED_INT8 + INTER] if args.threads > 1 else []
    compiled = [COMPILED, COMPILED_RULE, COMPILED_BF16, COMPILED_INT8, *inter]
    names = [f"glassformer/{d}" for d in GLASSFORMER] + (compiled if getattr(args, "compiled", False) else [])
    if args.ct2:
        import ctranslate2
        supported = ctranslate2.get_supported_compute_types("cpu")
        layouts = ("", INTER) if args.threads > 1 else ("",)
        names += [f"ctranslate2/{t}{x}" for t in CT2_TYPES if t in supported for x in layouts]
    if args.hf:
        names += [f"transformers/{t}" for t in HF_TYPES]
    return names


def sentences(run: str, limit: int | None, exports: Sequence[str]):
    """(source ids, reference English, target tokenizer, per-export source-tokenizer mismatches)."""
    from glassformer.data.checkpoint import load_translator_parts
    from glassformer.data.datasets import load_split
    model, source, target, _ = load_translator_parts(run)
    pairs = [*load_split("test"), *load_split("tatoeba")][:limit]
    ids = [source.encode(p.zh)[: model.cfg.max_len] for p in pairs]          # glassformer's own cut (--truncate)
    mismatches = {}
    for folder in exports:
        path = Path(folder) / "source_tokenizer.json"
        if path.exists():
            tok = TokenMap(path).tokenizer
            mismatches[str(folder)] = sum(tok.encode(p.zh).ids != i for p, i in zip(pairs, ids, strict=True))
    return ids, [p.en for p in pairs], target, mismatches



def race(args) -> dict:
    from glassformer.decoding.evaluate import score

    from .stats import speedup, summary
    names = systems(args)
    ids, refs, target, mismatches = sentences(args.run, args.sentences, [a for a in (args.ct2, args.hf) if a])
    plan = cases(args.quick, args.b1_sentences)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)                          # noqa: E731
    log(f"race: {len(ids)} sentences, systems {', '.join(names)}, {args.rounds} round(s)")
    workers = {n: WorkerProcess(n, args) for n in names}
    timings = {(c.name, n): [] for c in plan for n in names}
    outputs: dict[tuple[str, str], list[list[int]]] = {}
    try:
        for w in workers.values():
            w.call({"sources": ids})
        for c in plan:                                                                 # warm-up
            for w in workers.values():
                w.call({"beam": c.beam, "batch": c.batch, "sentences": min(8, len(ids))})
        for r in range(args.rounds):
            for c in plan:
                order = names[r % len(names):] + names[: r % len(names)]             # rotate who goes first
                for n in order:
                    reply = workers[n].call({"beam": c.beam, "batch": c.batch, "sentences": c.sentences})
                    tokens = sum(len(o) for o in reply["outputs"])
                    timings[c.name, n].append(tokens / reply["seconds"])
                    outputs.setdefault((c.name, n), reply["outputs"])
                log(f"round {r + 1}/{args.rounds} {c.name} done")
        memory = {n: {"rss_loaded_mb": w.loaded["rss_loaded_mb"], "rss_peak_mb": w.call({"rss": True})["rss_peak_mb"]}
                  for n, w in workers.items()}
    finally:
        for w in workers.values():
            w.close()
    results = []
    for c in plan:
        n_sent = len(outputs[c.name, BASELINE])
        reference = outputs[c.name, BASELINE]
        for n in names:
            hyps = [target.decode(o) for o in outputs[c.name, n]]
            s = score(hyps, refs[:n_sent])
            results.append({"case": c.name, "system": n, "tokens_per_s": summary(timings[c.name, n]),
                            "bleu": round(s.bleu, 2), "chrf": round(s.chrf, 2), "sentences": n_sent,
                            "differ_from_baseline": count_differences(outputs[c.name, n], reference),
                            **memory[n]})
    shapes = QUICK_ROOFLINE_SHAPES if args.quick else ROOFLINE_SHAPES
    return {"machine": machine(args), "cases": [c.as_dict() for c in plan], "results": results,
            "comparisons": comparisons(results, timings, speedup), "roofline": roofline(args.threads, shapes=shapes),
            "source_tokenizer_mismatches": mismatches, "bleu_signature": s.bleu_signature}


def comparisons(results: list[dict], timings: dict, speedup) -> list[dict]:
    """Per case: the fastest glassformer float32 system (eager, compiled, either stopping rule) over CTranslate2's
    fastest float32 layout, and the fastest of each that holds quality (glassformer: BLEU within QUALITY_BLEU of
    its float32; CTranslate2: its fastest compute_type and layout)."""
    out = []
    for case in dict.fromkeys(r["case"] for r in results):
        rows = [r for r in results if r["case"] == case]
        base = next(r for r in rows if r["system"] == BASELINE)
        ours = [r for r in rows if r["system"].startswith("glassformer/") and r["bleu"] >= base["bleu"] - QUALITY_BLEU]
        theirs = [r for r in rows if r["system"].startswith("ctranslate2/")]
        if not theirs:
            continue
        fastest = lambda group: max(group, key=_median)                                   # noqa: E731
        best_ours, best_theirs = fastest(ours), fastest(theirs)
        ours32 = fastest([r for r in rows if r["system"] in FLOAT32])
        theirs32 = [r for r in theirs if r["system"].removesuffix(INTER) == "ctranslate2/float32"]
        pairs = [("precision for precision", ours32["system"], fastest(theirs32)["system"] if theirs32 else ""),
                 ("best against best", best_ours["system"], best_theirs["system"])]
        if any(r["system"] == COMPILED_RULE for r in rows) and "beam" in case:
            pairs.append(("CTranslate2's stopping rule", COMPILED_RULE, best_theirs["system"]))
        for what, a, b in pairs:
            if (case, b) in timings and all(timings[case, a]) and all(timings[case, b]):   # no empty outputs
                out.append({"case": case, "comparison": what, "ours": a, "theirs": b,
                            "speedup": speedup(timings[case, a], timings[case, b])})
    return out


def _median(result: dict) -> float:
    return result["tokens_per_s"]["median"]


def machine(args) -> dict:
    """benchmarks.run's machine description, with this command, the CPU's precision flags and the versions."""
    from glassformer.inference.precision import cpu_precision_support

    from .run import _version, machine_info
    info = machine_info(args.threads, [])
    info.update(omp_wait_policy=args.omp_wait_policy, command=" ".join(["python -m benchmarks.race", *sys.argv[1:]]),
                precision=cpu_precision_support().as_dict(),
                versions={p: _version(p) for p in ("torch", "ctranslate2", "transformers", "glassformer")})
    return info


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def markdown(report: dict) -> str:
    """The report as markdown: the machine, one table per case, the comparisons and the roofline."""
    m = report["machine"]
    p = m["precision"]
    lines = [f"Race on {m['cpu']}, {m['threads']} threads, OMP_WAIT_POLICY {m['omp_wait_policy']}, "
             f"{m['date']} (`{m['command']}`)", "",
             f"CPU: torch capability {p['capability']}, flags {', '.join(p['flags']) or 'none of interest'}; "
             f"AMX {'present' if p['amx'] else 'absent'}. Versions: "
             + ", ".join(f"{k} {v}" for k, v in m["versions"].items()), ""]
    for case in report["cases"]:
        rows = [r for r in report["results"] if r["case"] == case["name"]]
        if not rows:
            continue
        lines += [f"### {case['name']} (beam {case['beam']}, batch {case['batch']}, {rows[0]['sentences']} sentences)",
                  "", "| system | target tok/s median [min, max] | BLEU | chrF | differ from glassformer fp32 "
                  "| RSS loaded / peak MiB |", "|---|---|---|---|---|---|"]
        for r in rows:
            t = r["tokens_per_s"]
            lines.append(f"| {r['system']} | {_fmt(t['median'])} [{_fmt(t['min'])}, {_fmt(t['max'])}] | "
                         f"{r['bleu']:.2f} | {r['chrf']:.2f} | {r['differ_from_baseline']} | "
                         f"{r['rss_loaded_mb']:,.0f} / {r['rss_peak_mb']:,.0f} |")
        lines.append("")
    if report["comparisons"]:
        lines += ["| case | comparison | ours / theirs | speed-up median [min, max] |", "|---|---|---|---|"]
        for c in report["comparisons"]:
            s = c["speedup"]
            lines.append(f"| {c['case']} | {c['comparison']} | {c['ours']} / {c['theirs']} | "
                         f"{s['median']:.2f}x [{s['min']:.2f}, {s['max']:.2f}] |")
        lines.append("")
    lines += ["| product (m x k by k x n), GFLOP/s | float32 | bfloat16 | int8 (dynamic linear) |", "|---|---|---|---|"]
    shapes = dict.fromkeys((r["m"], r["k"], r["n"]) for r in report["roofline"])
    for shape in shapes:
        by = {r["dtype"]: r["gflops"] for r in report["roofline"] if (r["m"], r["k"], r["n"]) == shape}
        cells = " | ".join("skipped (too slow)" if by[d] is None else _fmt(by[d]) for d in GLASSFORMER)
        lines.append(f"| {shape[0]} x {shape[1]} by {shape[1]} x {shape[2]} | {cells} |")
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.race", description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="glassformer run folder (the trained model)")
    p.add_argument("--ct2", help="its CTranslate2 export (glassformer export --to ctranslate2)")
    p.add_argument("--hf", help="its transformers export (glassformer export --to transformers)")
    p.add_argument("--quick", action="store_true", help="64 sentences, 16 at batch 1, one round")
    p.add_argument("--compiled", action="store_true",
                   help="also glassformer float32 on the compiled decoding step (needs a C++ compiler)")
    p.add_argument("--rounds", type=int, help="rounds (default 3; 1 with --quick)")
    p.add_argument("--sentences", type=int, help="use only the first N sentences (default all)")
    p.add_argument("--b1-sentences", type=int, default=256, help="sentences of the batch-1 case (default 256)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                   else os.cpu_count() or 1, help="intra-op threads of every system (default: usable cores)")
    p.add_argument("--omp-wait-policy", choices=WAIT_POLICIES, default="default",
                   help="OMP_WAIT_POLICY of every worker (default: the variable unset, OpenMP's own policy, what "
                        "a user of each system gets; PASSIVE for a machine busy with other work)")
    p.add_argument("--out", help="JSON report path (default benchmarks/results/race-DATE.json, .md beside it)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.sentences = min(args.sentences or 64, 64)
    args.rounds = args.rounds or (1 if args.quick else 3)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        return worker(args)
    for flag, folder in (("--run", args.run), ("--ct2", args.ct2), ("--hf", args.hf)):
        if folder and not Path(folder).is_dir():
            print(f"{flag}: {folder} is not a folder", file=sys.stderr)
            return 2
    if args.ct2 and importlib.util.find_spec("ctranslate2") is None:
        print("--ct2 needs CTranslate2: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    report = race(args)
    out = Path(args.out) if args.out else HERE / "results" / f"race-{datetime.date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    text = markdown(report)
    out.with_suffix(".md").write_text(text)
    print(text)
    print(f"written: {out} and {out.with_suffix('.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
