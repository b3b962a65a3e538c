"""Benchmark driver: glassformer beside torch.nn.Transformer and Hugging Face Marian on the same work.

Each system runs in its own process with the same thread count. Every case starts with warm-up
calls, then interleaved rounds (glassformer, torch, marian, glassformer, ...); medians with min/max
are reported, and speed ratios are taken round by round, so machine load hits all systems alike.

    python -m benchmarks.run            # full run (several minutes)
    python -m benchmarks.run --quick    # smoke run (about a minute)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from .pipe import WAIT_POLICY, JsonWorker
from .pipe import child_env as _child_env
from .stats import speedup, summary
from .systems import SYSTEMS

HERE = Path(__file__).resolve().parent


@dataclass
class Participant:
    label: str       # row name in the table, e.g. "glassformer (cache)"
    system: str      # which worker runs it
    request: dict


@dataclass
class Case:
    id: str
    title: str
    unit: str                      # "tok/s" (higher is better) or "ms/step" (lower is better)
    participants: list[Participant]
    comparisons: list[tuple[str, str]]   # (ours, theirs) labels
    rounds: int
    warmup: int
    samples: dict[str, list[float]] = field(default_factory=dict)
    cpu_seconds: dict[str, list[float | None]] = field(default_factory=dict)   # process CPU time per sample

    @property
    def higher_is_better(self) -> bool:
        return self.unit != "ms/step"


@dataclass
class Settings:
    rounds: int
    warmup: int
    train_steps: int
    corpus_sentences: int
    corpus_rounds: int
    greedy_batches: tuple[int, ...]
    beam_batches: tuple[int, ...]
    step_prefixes: tuple[int, ...]
    step_count: int
    memory_steps: int


QUICK = Settings(rounds=3, warmup=1, train_steps=2, corpus_sentences=128, corpus_rounds=3,
                 greedy_batches=(1, 32), beam_batches=(1,), step_prefixes=(16, 256), step_count=4,
                 memory_steps=2)
FULL = Settings(rounds=7, warmup=2, train_steps=4, corpus_sentences=1280, corpus_rounds=5,
                greedy_batches=(1, 32), beam_batches=(1, 8), step_prefixes=(16, 32, 64, 128, 256),
                step_count=8, memory_steps=5)

VERSUS_PEERS = [("glassformer", "torch"), ("glassformer", "marian"), ("glassformer", "glassformer-base")]
BASELINE = "glassformer-base"   # glassformer from another source tree (--baseline-src), to measure a change


def build_cases(s: Settings, systems: tuple[str, ...], only: set[str] | None) -> list[Case]:
    """The benchmark cases for these settings (issue 5, cases 1-4 and 6; memory is measured apart)."""
    def each(request: dict) -> list[Participant]:
        return [Participant(name, name, request) for name in systems]

    peers = [c for c in VERSUS_PEERS if c[1] in systems and c[0] in systems]
    cases = [
        Case("train", "training step, 64 padded random pairs (lengths 4-14), fwd+bwd+AdamW", "tok/s",
             each({"case": "train", "steps": s.train_steps}), peers, s.rounds, s.warmup),
        Case("corpus", f"training on the HSK corpus, one pass over {s.corpus_sentences} train sentences "
             "(glassformer: token-count buckets; peers: random batches of 64)", "tok/s",
             each({"case": "corpus"}), peers, s.corpus_rounds, s.warmup),
    ]
    for b in s.greedy_batches:
        cases.append(Case(f"greedy-b{b}", f"greedy decoding, 32 new tokens from a 12-token source, batch {b}",
                          "tok/s", each({"case": "greedy", "batch": b, "new": 32}), peers, s.rounds,
                          s.warmup))
    for b in s.beam_batches:
        cases.append(Case(f"beam4-b{b}", f"beam-4 decoding, 32 new tokens, batch {b}", "tok/s",
                          each({"case": "beam", "batch": b, "new": 32, "beams": 4}), peers, s.rounds,
                          s.warmup))
    for p in s.step_prefixes:
        step = {"case": "step", "prefix": p, "steps": s.step_count, "batch": 1}
        parts = []
        if "glassformer" in systems:
            parts += [Participant("glassformer (cache)", "glassformer", {**step, "cached": True}),
                      Participant("glassformer (recompute)", "glassformer", {**step, "cached": False})]
        if BASELINE in systems:
            parts.append(Participant(f"{BASELINE} (cache)", BASELINE, {**step, "cached": True}))
        if "torch" in systems:
            parts.append(Participant("torch (recompute)", "torch", {**step, "cached": False}))
        if "marian" in systems:
            parts.append(Participant("marian (cache)", "marian", {**step, "cached": True}))
        labels = {q.label for q in parts}
        comparisons = [c for c in [("glassformer (cache)", "glassformer (recompute)"),
                                   ("glassformer (cache)", "marian (cache)"),
                                   ("glassformer (cache)", f"{BASELINE} (cache)")]
                       if c[0] in labels and c[1] in labels]
        cases.append(Case(f"step-{p}", f"one decoding step after a {p}-token prefix, batch 1", "ms/step",
                          parts, comparisons, s.rounds, s.warmup))
    if only:
        cases = [c for c in cases if c.id in only or c.id.split("-")[0] in only]
    return cases


# ---- workers -------------------------------------------------------------------------------------
class WorkerProcess(JsonWorker):
    """A `benchmarks.worker` subprocess for system `name` (glassformer-base: from --baseline-src)."""

    def __init__(self, name: str, threads: int, seed: int, corpus_file: str | None,
                 src: str | None = None) -> None:
        self.system = name
        cmd = [sys.executable, "-m", "benchmarks.worker", _system_of(name), "--threads", str(threads),
               "--seed", str(seed)]
        if corpus_file:
            cmd += ["--corpus", corpus_file]
        super().__init__(name, cmd, _harness_of(src), _child_env(threads, src), {"case": "quit"})


def _system_of(name: str) -> str:
    return "glassformer" if name == BASELINE else name


def _harness_of(src: str | None) -> Path:
    """Where a worker runs `-m benchmarks.worker` from: this tree, or, for --baseline-src DIR/src, DIR itself when
    it holds its own benchmarks/ (its systems.py is written against its own API; the JSON protocol is shared)."""
    if src and (Path(src).resolve().parent / "benchmarks" / "worker.py").is_file():
        return Path(src).resolve().parent
    return HERE.parent


def measure(case: Case, workers: dict[str, WorkerProcess], log) -> None:
    """Warm-ups, then `case.rounds` interleaved rounds; fills case.samples (rates or ms per step)."""
    for _ in range(case.warmup):
        for p in case.participants:
            workers[p.system].call(p.request)
    case.samples = {p.label: [] for p in case.participants}
    case.cpu_seconds = {p.label: [] for p in case.participants}
    for _ in range(case.rounds):
        for p in case.participants:
            reply = workers[p.system].call(p.request)
            value = reply["seconds"] * 1000 if case.unit == "ms/step" else reply["units"] / reply["seconds"]
            case.samples[p.label].append(value)
            case.cpu_seconds[p.label].append(reply.get("cpu"))
    log(f"  {case.id}: " + ", ".join(f"{k} {summary(v)['median']:.4g}" for k, v in case.samples.items()))


def memory_peaks(systems: tuple[str, ...], threads: int, seed: int, steps: int,
                 baseline_src: str | None = None) -> list[dict]:
    """Case 5: each system alone in a fresh process, ru_maxrss around `steps` training steps."""
    out = []
    for name in systems:
        cmd = [sys.executable, "-m", "benchmarks.worker", _system_of(name), "--threads", str(threads),
               "--seed", str(seed), "--memory", str(steps)]
        src = baseline_src if name == BASELINE else None
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=_harness_of(src), env=_child_env(threads, src),
                              check=False)
        if done.returncode != 0:
            raise RuntimeError(f"memory probe {name} failed:\n{done.stderr[-2000:]}")
        out.append({**json.loads(done.stdout.strip().splitlines()[-1]), "system": name})
    return out


# ---- machine and report --------------------------------------------------------------------------
def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_info(threads: int, argv: list[str]) -> dict:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": threads,
            "omp_wait_policy": WAIT_POLICY or "default", "python": platform.python_version(),
            "torch": _version("torch"), "transformers": _version("transformers"),
            "platform": platform.platform(),
            "command": " ".join(["python -m benchmarks.run", *argv]),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "load_average_start": list(os.getloadavg())}


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def markdown(cases: list[Case], memory: list[dict], machine: dict, parameters: dict[str, int]) -> str:
    lines = [f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['threads']} threads per system; "
             f"torch {machine['torch']}, transformers {machine['transformers']}, Python {machine['python']}",
             f"Command: `{machine['command']}` ({machine['date']}; load average at start "
             f"{machine['load_average_start'][0]:.2f}, at end {machine.get('load_average_end', [0])[0]:.2f})",
             "Parameters (trainable, tied counted once): "
             + ", ".join(f"{k} {v:,}" for k, v in parameters.items()), "",
             "| case | system | median | min | max | unit |", "|---|---|---:|---:|---:|---|"]
    for case in cases:
        for label, values in case.samples.items():
            s = summary(values)
            lines.append(f"| {case.id} | {label} | {_fmt(s['median'])} | {_fmt(s['min'])} | {_fmt(s['max'])} "
                         f"| {case.unit} |")
    lines += ["", "| case | speed-up | median | min | max | rounds |", "|---|---|---:|---:|---:|---:|"]
    for case in cases:
        for ours, theirs in case.comparisons:
            s = speedup(case.samples[ours], case.samples[theirs], case.higher_is_better)
            lines.append(f"| {case.id} | {ours} vs {theirs} | {s['median']:.2f}x | {s['min']:.2f}x "
                         f"| {s['max']:.2f}x | {s['n']} |")
    if memory:
        lines += ["", "| training-step memory | RSS after build | peak RSS | peak - build |",
                  "|---|---:|---:|---:|"]
        for m in memory:
            mib = [m[k] / 1024 for k in ("rss_after_build_kib", "peak_kib", "training_peak_over_build_kib")]
            lines.append(f"| {m['system']} | {mib[0]:.0f} MiB | {mib[1]:.0f} MiB | {mib[2]:.0f} MiB |")
    lines += ["", "Case titles:"] + [f"- {c.id}: {c.title}" for c in cases]
    return "\n".join(lines)


def report(cases: list[Case], memory: list[dict], machine: dict, parameters: dict[str, int],
           settings: Settings) -> dict:
    return {
        "machine": machine, "settings": settings.__dict__, "parameters": parameters, "memory": memory,
        "cases": [{"id": c.id, "title": c.title, "unit": c.unit, "rounds": c.rounds, "warmup": c.warmup,
                   "requests": {p.label: p.request for p in c.participants},
                   "samples": c.samples, "cpu_seconds": c.cpu_seconds,
                   "stats": {k: summary(v) for k, v in c.samples.items()},
                   "speedups": [{"ours": a, "theirs": b,
                                 **speedup(c.samples[a], c.samples[b], c.higher_is_better)}
                                for a, b in c.comparisons]}
                  for c in cases],
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer rounds and smaller cases")
    parser.add_argument("--out", default=None, help="JSON results (default benchmarks/results/DATE.json)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of "
                        + ",".join(SYSTEMS))
    parser.add_argument("--cases", default="", help="comma-separated case ids or kinds (train, corpus, "
                        "greedy, beam4, step, memory); default all")
    parser.add_argument("--rounds", type=int, default=None, help="override the number of timed rounds")
    parser.add_argument("--baseline-src", default=None, metavar="DIR",
                        help=f"also run glassformer imported from DIR (a src/ folder) as '{BASELINE}'")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    systems = tuple(s for s in args.systems.split(",") if s)
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        print(f"benchmarks.run: error: unknown system {unknown[0]!r}; expected {', '.join(SYSTEMS)}",
              file=sys.stderr)
        return 2
    if args.baseline_src:
        if not (Path(args.baseline_src) / "glassformer" / "__init__.py").is_file():
            print(f"benchmarks.run: error: --baseline-src {args.baseline_src} has no glassformer/__init__.py",
                  file=sys.stderr)
            return 2
        systems = (*systems, BASELINE)
    if "marian" in systems and _version("transformers") == "not installed":
        print("benchmarks.run: error: marian needs transformers (pip install 'glassformer[bench]')",
              file=sys.stderr)
        return 2
    settings = QUICK if args.quick else FULL
    if args.rounds is not None:
        if args.rounds < 1:
            print("benchmarks.run: error: --rounds must be >= 1", file=sys.stderr)
            return 2
        settings = Settings(**{**settings.__dict__, "rounds": args.rounds, "corpus_rounds": args.rounds})
    only = {c for c in args.cases.split(",") if c} or None
    cases = build_cases(settings, systems, only)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    machine = machine_info(args.threads, argv)
    machine["baseline_src"] = args.baseline_src
    log(f"benchmarks on {machine['cpu']} ({machine['cores']} cores), {args.threads} threads per system")
    corpus_file = None
    if any(c.id == "corpus" for c in cases):
        from .work import bucket_budget, corpus_pairs

        pairs = corpus_pairs(settings.corpus_sentences, seed=args.seed)
        handle = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump({"pairs": pairs, "batch": 64, "max_tokens": bucket_budget(pairs, 64)}, handle)
        handle.close()
        corpus_file = handle.name
        log(f"corpus: {len(pairs)} HSK train pairs, bucket budget {bucket_budget(pairs, 64)} tokens")

    workers: dict[str, WorkerProcess] = {}
    parameters: dict[str, int] = {}
    try:
        for name in systems:
            workers[name] = WorkerProcess(name, args.threads, args.seed, corpus_file,
                                          args.baseline_src if name == BASELINE else None)
        for name, w in workers.items():
            w.read()                                                         # "ready"
            parameters[name] = w.call({"case": "info"})["parameters"]
        for case in cases:
            measure(case, workers, log)
    finally:
        for w in workers.values():
            w.close()
        if corpus_file:
            os.unlink(corpus_file)
    memory = []
    if only is None or "memory" in only:
        memory = memory_peaks(systems, args.threads, args.seed, settings.memory_steps, args.baseline_src)
    machine["load_average_end"] = list(os.getloadavg())

    print(markdown(cases, memory, machine, parameters))
    out = Path(args.out) if args.out else HERE / "results" / (
        datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + ("-quick" if args.quick else "") + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report(cases, memory, machine, parameters, settings), indent=1))
    log(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
