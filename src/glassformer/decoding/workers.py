"""Decoding in worker processes: a job's batches dealt to N processes, each decoding on one thread
(CTranslate2's `inter_threads` layout; docs/performance.md). For long jobs on several cores:

    translator.workers = 2            # translate / evaluate --workers 2
    translator.translate(lines)       # batches of 64 sentences, half of them in each process

The decoding loop is Python: two threads of one process wait on each other's interpreter lock at every
operation, two processes do not. Each worker gets a copy of the model when it starts (a spawned process, one
intra-op thread, its own compiled packages, built for one thread); the workers stay for the Translator's
later jobs and end with the process that started them: at its exit they are closed (their pipes, then a wait), not
terminated, so each lets go of its packages (the C++ loader then removes the folder it unpacked each into).
"""

from __future__ import annotations

import atexit
import multiprocessing
import sys
import warnings
from collections.abc import Sequence

from ..errors import UsageError
from ..threads import usable_cores

Batch = list[list[int]]                     # one batch: source ids per sentence


def check_workers(n: int) -> int:
    """`n` if it is a worker count this process can run (1 .. its usable cores), else a UsageError."""
    cores = usable_cores()
    if not 1 <= n <= cores:
        raise UsageError(f"--workers: {n}, outside 1..{cores} (the cores this process may use)", "workers")
    return n


def deal(costs: Sequence[int], n: int) -> list[list[int]]:
    """Batch indices for `n` workers: the costliest batch first, each to the worker with the least work so far
    (ties: the lowest worker); each worker's batches in their original order."""
    loads, shares = [0] * n, [[] for _ in range(n)]
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        k = loads.index(min(loads))
        loads[k] += costs[i]
        shares[k].append(i)
    return [sorted(s) for s in shares]


FIXED = 8      # a batch's work beside its source length, in source positions (docs/performance.md: the deal)


def cost(batch: Batch) -> int:
    """A batch's work: its rows times its longest source (what a padded batch computes) plus FIXED (the steps of
    even the shortest sentences, a batch's start and end: a batch of 4-token sources took 117 us a row-position,
    one of 62 tokens 57, at one thread on the default model)."""
    return len(batch) * (max((len(s) for s in batch), default=0) + FIXED)


class Workers:
    """N spawned processes, each holding a copy of `translator` (a Translator that decodes in-process: its model,
    compile mode and cache folder); `decode` deals batches to them."""

    def __init__(self, translator, n: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.key = (translator.model, translator.compile, translator.compile_cache, translator.precision)   # held
        self.pipes, self.processes = [], []
        for _ in range(n):
            ours, theirs = context.Pipe()
            process = context.Process(target=_serve, args=(theirs, translator, warnings.filters), daemon=True)
            process.start()
            theirs.close()
            self.pipes.append(ours)
            self.processes.append(process)
        atexit.register(self.close)            # before multiprocessing's own exit handler, which terminates them

    def decode(self, batches: Sequence[Batch], beam: int, alpha: float, max_length: int | None, stop: str,
               sentences: int) -> list[list[list[int]]]:
        """Target ids per batch, in the order of `batches`; a worker that fails or ends is a RuntimeError."""
        shares = deal([cost(b) for b in batches], len(self.pipes))
        out: list = [None] * len(batches)
        try:
            for pipe, share in zip(self.pipes, shares, strict=True):
                pipe.send(([batches[i] for i in share], beam, alpha, max_length, stop, sentences))
            replies = [pipe.recv() for pipe in self.pipes]
        except (EOFError, OSError) as error:
            raise RuntimeError(f"a decoding worker ended ({type(error).__name__})") from error
        for reply, share in zip(replies, shares, strict=True):
            if isinstance(reply, str):
                raise RuntimeError(reply)
            for i, found in zip(share, reply, strict=True):
                out[i] = found
        return out

    def close(self) -> None:
        atexit.unregister(self.close)
        for pipe in self.pipes:
            pipe.close()
        for process in self.processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()


def note(line: str) -> None:
    """A worker's one-line remark, on stderr."""
    print(f"glassformer (worker): {line}", file=sys.stderr)


def _serve(pipe, translator, filters: list) -> None:
    """A worker process's start and loop: one intra-op thread, the inductor cache and the warnings filters of the
    job's command; then (batches, beam, alpha, max_length, stop, sentences) in, target ids per batch (or one line
    of error) out."""
    import signal

    import torch

    from ..inference.compiler import use_compile_cache

    warnings.filters[:] = filters                         # what the command chose not to print (inductor's, tuning)
    signal.signal(signal.SIGINT, signal.SIG_IGN)          # Ctrl-C is the Translator's process's to answer
    torch.set_num_threads(1)
    if translator.compile != "off":
        use_compile_cache(translator.compile_cache)
    translator.threads = 1                                                   # its packages: built for one thread
    while True:
        try:
            batches, beam, alpha, max_length, translator.stop, sentences = pipe.recv()
        except (EOFError, OSError):                                          # the Translator's process is gone
            return
        try:
            reply = translator.decode_batches(batches, beam, alpha, max_length, sentences)
        except Exception as error:                                           # sent back, raised there
            reply = f"a decoding worker failed: {type(error).__name__}: {error}"
        try:
            pipe.send(reply)
        except OSError:                                                      # the Translator stopped listening
            return
