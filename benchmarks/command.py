"""The race at the command's level: `glassformer translate` on a file against CTranslate2 with its tokenizers
(benchmarks/ct2_translate.py), each a process started as a user starts it, each at its best layouts.

    python -m benchmarks.command --run runs/default --ct2 runs/default-exports/ctranslate2
    python -m benchmarks.command --run RUN --ct2 CT2 --repeat 4 --cases greedy-b32 --rounds 5   # 4,988 sentences

The file: the HSK test and Tatoeba held-out Chinese sentences (1,247), `--repeat` times. Each system runs the
whole file once untimed (`--compile on` builds or loads every package the job needs), then in each round the
job and a one-sentence job (its start-up: the interpreter, imports, the model, the packages), in turn with the
other systems. Reported per system: the job's seconds, the start-up's, and English words a second over the job
less its start-up (the words of the output lines, split at spaces). glassformer: `translate --compile on
--batch-size B [--beam K] [--dtype D] --workers 1|2`, and for a beam search each also with `--stop full`
(`/stop-full`: CTranslate2's stopping rule with a length penalty, once K hypotheses are in; the default rule searches
on until no live beam can still win: more steps), compared apart; CTranslate2: one translator on `--threads`
intra-op threads, and `inter_threads=--threads, intra_threads=1`, at float32 and int8. The outputs of glassformer's
float32 systems of one rule must be one and the same (the report counts those that differ from the default rule's;
the md5 of its lines tells a tree from another).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .stats import median, speedup

HERE = Path(__file__).resolve().parent
CASES = {"greedy-b32": (1, 32), "greedy-b1": (1, 1), "beam4-b32": (4, 32)}
B1_SENTENCES = 256


def systems(args) -> dict[str, list[str]]:
    """name -> the command line (stdin: the Chinese lines), before the case's batch size and beam are added."""
    gf = [str(Path(sys.executable).parent / "glassformer"), "translate", "--model", args.run, "--compile", "on"]
    out = {}
    for dtype in args.dtypes.split(","):
        for workers in sorted({1, args.threads}):
            out[f"glassformer/{dtype}/workers{workers}"] = [*gf, "--dtype", dtype, "--workers", str(workers)]
    if args.ct2:
        ct2 = [sys.executable, "-m", "benchmarks.ct2_translate", "--model", args.ct2, "--threads", str(args.threads),
               "--max-positions", str(_max_len(args.run))]
        for dtype in args.dtypes.split(","):
            if args.threads == 1 or args.ct2_layouts in ("both", "intra"):
                out[f"ctranslate2/{dtype}"] = [*ct2, "--compute-type", dtype]
            if args.threads > 1 and args.ct2_layouts in ("both", "inter"):
                out[f"ctranslate2/{dtype}-inter"] = [*ct2, "--compute-type", dtype, "--inter"]
    return out


def sample(n: int, shortest: int = 2, longest: int = 40, seed: int = 0) -> list[str]:
    """`n` distinct Chinese sentences of the Tatoeba training slice, `shortest`..`longest` characters, drawn with
    `seed`: a job whose every sentence is new (no shape a process has seen), as a user's file is."""
    import random

    from glassformer.data.datasets import load_tatoeba_splits

    pool = sorted({p.zh for p in load_tatoeba_splits().train if shortest <= len(p.zh) <= longest})
    if not 1 <= n <= len(pool):
        raise ValueError(f"--sample: {n} sentences, outside 1..{len(pool)} (the distinct ones there are)")
    return random.Random(seed).sample(pool, n)


def _max_len(run: str) -> int:
    return int(json.loads((Path(run) / "config.json").read_text())["model"]["max_len"])


def _run(command: list[str], text: str) -> tuple[float, str]:
    """Wall seconds of `command` reading `text` on stdin, and its stdout; a failure stops the race."""
    began = time.perf_counter()
    done = subprocess.run(command, input=text, capture_output=True, text=True, cwd=HERE.parent)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}: {done.stderr[-2000:]}")
    return seconds, done.stdout


def race(args, lines: list[str]) -> dict:
    """Each system on `lines` (the Chinese input, one a line), as `args` asks."""
    from glassformer.inference.precision import cpu_precision_support

    commands = systems(args)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)                          # noqa: E731
    report = {"machine": {"cpu": torch_capability(), "flags": sorted(cpu_precision_support().flags),
                          "threads": args.threads, "date": datetime.datetime.now().isoformat(timespec="seconds"),
                          "command": " ".join(["python -m benchmarks.command", *sys.argv[1:]])}, "cases": []}
    for case in args.cases.split(","):
        beam, batch = CASES[case]
        job = lines[:B1_SENTENCES] if batch == 1 else lines
        text, one = "".join(f"{line}\n" for line in job), f"{job[0]}\n"
        runs = case_runs(commands, beam, batch)
        outputs = {}
        for name, command in runs.items():                                  # untimed: builds or loads, warms
            outputs[name] = _run(command, text)[1]
            _run(command, one)
            log(f"{case}: {name} ready")
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
        names = list(runs)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:     # the order rotates round by round
                seconds, out = _run(runs[name], text)
                start = _run(runs[name], one)[0]
                times[name].append((seconds, start))
                if out != outputs[name]:
                    raise RuntimeError(f"{name} translated the same file differently in round {r + 1}")
            log(f"{case}: round {r + 1}/{args.rounds}")
        words = {name: sum(len(line.split()) for line in out.splitlines()) for name, out in outputs.items()}
        base = outputs.get("glassformer/float32/workers1", "").splitlines()
        rows = []
        for name in runs:
            rates = [words[name] / max(seconds - start, 1e-9) for seconds, start in times[name]]
            rows.append({"system": name, "sentences": len(job), "words": words[name],
                         "job_s": median([s for s, _ in times[name]]), "start_s": median([s for _, s in times[name]]),
                         "words_per_s": median(rates), "rates": rates,
                         "md5": hashlib.md5(outputs[name].encode()).hexdigest(),
                         "differ_from_glassformer_float32": sum(a != b for a, b in zip(
                             outputs[name].splitlines(), base, strict=False)) if base else None})
        report["cases"].append({"case": case, "beam": beam, "batch": batch, "results": rows,
                                "comparisons": _comparisons(rows)})
    return report


FULL = "/stop-full"      # a glassformer system's beam search stopped by CTranslate2's rule (`--stop full`)


def case_runs(commands: dict[str, list[str]], beam: int, batch: int) -> dict[str, list[str]]:
    """The case's command lines: each system at the batch size and beam; for a beam search, each glassformer system
    also with `--stop full` (FULL): the default rule (bound) searches on until no live beam can still win,
    CTranslate2 (with a length penalty) stops once K hypotheses are in, a search of fewer steps: like against like."""
    runs = {name: [*command, "--batch-size", str(batch), "--beam", str(beam)] for name, command in commands.items()}
    if beam > 1:
        runs.update({name + FULL: [*line, "--stop", "full"] for name, line in list(runs.items())
                     if name.startswith("glassformer/")})
    return runs


def _comparisons(rows: list[dict]) -> list[dict]:
    """glassformer's fastest float32 over CTranslate2's fastest float32 layout; the fastest of each over all; for a
    beam search, the same with glassformer's systems stopped by CTranslate2's rule (FULL)."""
    def best(prefix: str, dtype: str = "", rule: bool = False) -> dict | None:
        group = [r for r in rows if r["system"].startswith(prefix) and f"/{dtype}" in r["system"]
                 and r["system"].endswith(FULL) == rule]
        return max(group, key=lambda r: r["words_per_s"]) if group else None
    out = []
    rule, theirs32, theirs_all = "CTranslate2's stopping rule", best("ctranslate2/", "float32"), best("ctranslate2/")
    for what, ours, theirs in (("float32", best("glassformer/", "float32"), theirs32),
                               ("best against best", best("glassformer/"), theirs_all),
                               (f"float32, {rule}", best("glassformer/", "float32", True), theirs32),
                               (f"best against best, {rule}", best("glassformer/", rule=True), theirs_all)):
        if ours and theirs:
            out.append({"comparison": what, "ours": ours["system"], "theirs": theirs["system"],
                        "speedup": speedup(ours["rates"], theirs["rates"])})
    return out


def split(args) -> dict:
    """Where `translate`'s time goes, in one process as the command runs it (one thread a job: `--workers`' layout;
    the same packages): the start (imports, the model and tokenizers, the packages' loads at the first batch), then
    for the job: segmentation and ids, the batches' decoding (of it: the package calls, the source side's and the
    steps', and the host's loop around them), detokenising. Best of `--rounds` jobs; seconds."""
    import collections
    import functools
    import gc

    began = time.perf_counter()
    import torch

    from glassformer.data.datasets import load_split
    from glassformer.decoding.translator import Translator
    from glassformer.inference import compiler
    imported = time.perf_counter()
    torch.set_num_threads(1)
    compiler.use_compile_cache()
    translator = Translator.load(args.run)
    gc.freeze()                          # as the command does once its model is loaded (decoding/commands.py)
    translator.compile, translator.threads = "on", 1
    translator.precision = args.dtypes.split(",")[0]
    loaded = time.perf_counter()
    beam, batch = CASES[args.cases.split(",")[0]]
    translator.batch_size = batch
    lines = (sample(args.sample) if args.sample is not None
             else [p.zh for p in [*load_split("test"), *load_split("tatoeba")]]) * args.repeat
    lines = lines[:B1_SENTENCES] if batch == 1 else lines
    spent: collections.Counter = collections.Counter()

    def timed(name, fn):
        @functools.wraps(fn)
        def run(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter() - t
        return run

    load = compiler._load
    compiler._load = lambda path, packs: timed("package calls: source side" if Path(path).name.startswith("source")
                                               else "package calls: steps", load(path, packs))
    translator.translate(lines[:1], beam)                                   # its packages loaded (or built)
    first = time.perf_counter()
    translator.translate(lines, beam)                                       # every package the job needs
    for method in ("analyse", "check_lengths", "translate_ids", "detokenize"):
        setattr(translator, method, timed(method, getattr(translator, method)))
    best: dict | None = None
    for _ in range(args.rounds):
        spent.clear()
        t = time.perf_counter()
        translator.translate(lines, beam)
        spent["job"] = time.perf_counter() - t
        if best is None or spent["job"] < best["job"]:
            best = dict(spent)
    best["package calls"] = best.get("package calls: source side", 0.0) + best.get("package calls: steps", 0.0)
    best["host loop (decoding less package calls)"] = best["translate_ids"] - best["package calls"]
    best["rest (sorting, the lines' list)"] = best["job"] - sum(best[m] for m in ("analyse", "check_lengths",
                                                                               "translate_ids", "detokenize"))
    return {"sentences": len(lines), "case": args.cases.split(",")[0], "precision": translator.precision,
            "imports_s": imported - began,
            "model_s": loaded - imported, "first_sentence_s": first - loaded,
            "job_s": {k: round(v, 4) for k, v in best.items()}}


def torch_capability() -> str:
    import torch
    return torch.backends.cpu.get_cpu_capability()


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"Command race on {m['cpu']} (flags {', '.join(m['flags'])}), {m['threads']} threads, {m['date']} "
             f"(`{m['command']}`)", ""]
    for case in report["cases"]:
        lines += [f"### {case['case']} (beam {case['beam']}, batch {case['batch']}, {case['results'][0]['sentences']} "
                  "sentences)", "", "| system | job s | start-up s | words/s (job less start-up) | differ | md5 |",
                  "|---|---:|---:|---:|---:|---|"]
        for r in case["results"]:
            lines.append(f"| {r['system']} | {r['job_s']:.2f} | {r['start_s']:.2f} | {r['words_per_s']:,.0f} | "
                         f"{r['differ_from_glassformer_float32']} | {r['md5'][:8]} |")
        for c in case["comparisons"]:
            s = c["speedup"]
            lines.append(f"\n{c['comparison']}: {c['ours']} / {c['theirs']} = {s['median']:.2f}x "
                         f"[{s['min']:.2f}, {s['max']:.2f}]")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.command", description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, help="a glassformer run folder (the trained model)")
    p.add_argument("--ct2", help="its CTranslate2 export (glassformer export --to ctranslate2)")
    p.add_argument("--cases", default="greedy-b32,greedy-b1,beam4-b32", help=f"of {', '.join(CASES)}")
    p.add_argument("--dtypes", default="float32,int8", help="precisions of both sides (default float32,int8)")
    p.add_argument("--repeat", type=int, default=1, help="the 1,247 sentences this many times (default 1)")
    p.add_argument("--sample", type=int, metavar="N", help="N distinct Tatoeba training sentences (2-40 characters, "
                   "seed 0) in place of the 1,247 (e.g. 5120: every sentence new, as in a user's file)")
    p.add_argument("--ct2-layouts", choices=("both", "inter", "intra"), default="both",
                   help="CTranslate2's layouts on several threads: inter_threads, one translator's intra-op threads, "
                        "or both (default)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="default: the usable cores")
    p.add_argument("--out", help="JSON report (default benchmarks/results/command-DATE.json, .md beside it)")
    p.add_argument("--split", action="store_true", help="only where `translate`'s time goes, in one process "
                   "(the first of --cases and of --dtypes, --sample's sentences; glassformer, one thread)")
    args = p.parse_args(argv)
    for flag, folder in (("--run", args.run), ("--ct2", args.ct2)):
        if folder and not Path(folder).is_dir():
            print(f"{flag}: {folder} is not a folder", file=sys.stderr)
            return 2
    if args.split:
        print(json.dumps(split(args), indent=1))
        return 0
    from glassformer.data.datasets import load_split

    try:
        lines = sample(args.sample) if args.sample is not None else [p.zh for split in ("test", "tatoeba")
                                                                       for p in load_split(split)]
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    report = race(args, lines * args.repeat)
    out = Path(args.out) if args.out else HERE / "results" / f"command-{datetime.date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    text = markdown(report)
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
