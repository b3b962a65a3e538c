"""One system in its own process: builds it once, then answers timing requests from the driver.

Protocol: one JSON request per stdin line, one JSON reply per stdout line. Requests:
  {"case": "train", "steps": k}                   k training steps on the fixed padded batches
  {"case": "corpus"}                              one pass over this system's corpus batches
  {"case": "greedy", "batch": b, "new": n}        greedy decoding of exactly n new tokens
  {"case": "beam", "batch": b, "new": n, "beams": k}
  {"case": "step", "prefix": p, "cached": bool, "steps": s}   seconds per decoding step
  {"case": "info"}                                parameters, versions, memory
Replies: {"seconds": wall seconds, "cpu": process CPU seconds, "units": work done, ...}.

`python -m benchmarks.worker SYSTEM --memory` instead runs a few training steps in a fresh process and
prints the resident-set peak (ru_maxrss) before and after them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time


def rss_kib() -> int:
    """Current resident set size in KiB (from /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") // 1024


def peak_kib() -> int:
    """Peak resident set size of this process so far (ru_maxrss, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class Worker:
    """Holds one built system and the inputs of every case, prepared outside the timings."""

    def __init__(self, name: str, seed: int, corpus_file: str | None, train_batches: int) -> None:
        from .systems import make_system
        from .work import training_batches

        self.system = make_system(name, seed=seed)
        self.raw = training_batches(train_batches, seed=seed)
        self.batches = [self.system.prepare(b) for b in self.raw]
        self.next = 0
        self.corpus: list = []
        self.corpus_tokens = 0
        self.corpus_padded = 0
        if corpus_file:
            self._load_corpus(corpus_file, seed)

    def _load_corpus(self, path: str, seed: int) -> None:
        from .work import bucketed_batches, fixed_size_batches

        with open(path) as f:
            data = json.load(f)
        pairs = [(s, t) for s, t in data["pairs"]]
        if self.system.name == "glassformer":
            raw = bucketed_batches(pairs, data["max_tokens"], seed)
        else:
            raw = fixed_size_batches(pairs, data["batch"], seed)
        self.corpus = [self.system.prepare(b) for b in raw]
        self.corpus_tokens = sum(b.n_tokens for b in raw)
        self.corpus_padded = sum(b.src.numel() + b.tgt_in.numel() for b in raw)

    def handle(self, request: dict) -> dict:
        import torch

        from .work import decoding_source

        case = request["case"]
        s = self.system
        t0, c0 = time.perf_counter(), time.process_time()
        extra: dict = {}
        if case == "train":
            units = 0
            for _ in range(request.get("steps", 1)):
                i = self.next % len(self.batches)
                self.next += 1
                s.train_step(self.batches[i])
                units += self.raw[i].n_tokens
        elif case == "corpus":
            for batch in self.corpus:
                s.train_step(batch)
            units = self.corpus_tokens
            extra = {"batches": len(self.corpus), "padded_tokens": self.corpus_padded}
        elif case in ("greedy", "beam"):
            src = decoding_source(request["batch"])
            t0, c0 = time.perf_counter(), time.process_time()
            if case == "greedy":
                out = s.greedy(src, request["new"])
            else:
                out = s.beam(src, request["new"], request["beams"])
            if tuple(out.shape) != (request["batch"], request["new"]):
                raise RuntimeError(f"{s.name} {case} returned shape {tuple(out.shape)}")
            units = out.numel()
        elif case == "step":
            torch.manual_seed(0)
            per_step = s.step_seconds(decoding_source(request.get("batch", 1)), request["prefix"],
                                      request["cached"], request["steps"])
            return {"seconds": per_step, "cpu": None, "units": 1}
        elif case == "info":
            return {"parameters": s.n_parameters(), "threads": torch.get_num_threads(),
                    "rss_kib": rss_kib(), "peak_kib": peak_kib()}
        else:
            raise ValueError(f"unknown case {case!r}")
        return {"seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0, "units": units, **extra}


def memory_probe(name: str, seed: int, steps: int) -> dict:
    """Fresh process: build, note RSS, run `steps` training steps, report the ru_maxrss peak."""
    from .systems import make_system
    from .work import training_batches

    system = make_system(name, seed=seed)
    batches = [system.prepare(b) for b in training_batches(min(steps, 8), seed=seed)]
    before = rss_kib()
    for i in range(steps):
        system.train_step(batches[i % len(batches)])
    return {"system": name, "rss_after_build_kib": before, "peak_kib": peak_kib(),
            "training_peak_over_build_kib": peak_kib() - before}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.worker")
    parser.add_argument("system")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", default=None, help="JSON file with the corpus pairs and batching")
    parser.add_argument("--train-batches", type=int, default=8)
    parser.add_argument("--memory", type=int, default=0, metavar="STEPS",
                        help="only measure the training-step memory peak over STEPS steps")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    if args.memory:
        print(json.dumps(memory_probe(args.system, args.seed, args.memory)), flush=True)
        return 0
    worker = Worker(args.system, args.seed, args.corpus, args.train_batches)
    print(json.dumps({"ready": args.system}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("case") == "quit":
            break
        try:
            reply = worker.handle(request)
        except Exception as error:  # reported to the driver, which stops the run
            reply = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
