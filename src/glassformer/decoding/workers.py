"""Decoding beside helper processes: a job's batches taken in turn by this process and N - 1 helpers, each
decoding on one thread (CTranslate2's `inter_threads` layout; docs/performance.md). For long jobs on several cores:

    translator.workers = 2            # translate / evaluate --workers 2
    translator.translate(lines)       # batches of 64 sentences, this process and one helper take them in turn

The decoding loop is Python: two threads of one process wait on each other's interpreter lock at every
operation, two processes do not. Every process takes the next batch from one shared count, costliest first (no
round trip a batch; a helper that is slow or still starting takes fewer, and the job never waits for one that took
none), and a helper sends its translations back once the count is spent. This process decodes its share at its own
thread count: the commands set one (decoding/commands.py). A helper is a process with one intra-op thread and its
own compiled packages (built for one thread): a spawned copy of the Translator's model (`Workers(translator, n)`),
or the model loaded from its folder (decoding/commands.py: the commands fork it once torch is imported, before they
load the model themselves, so both starts overlap and the helper imports nothing twice; it then loads the packages
the command's job decodes with while it waits for it: `Translator.warm`). Helpers stay for the
Translator's later jobs and end with the process that started them: at its exit they are closed (their pipes, then
a wait, so each lets go of its packages and ends, rather than being terminated by multiprocessing); one still
starting, which has loaded no package, is stopped there. A command's only job is its helpers' `last`: each lets go
of its packages and ends once it has sent its reply, beside this process's tail, where the close waited for it.
A helper with nothing to do segments lines for this process (`analyse`), e.g. a long job's later lines while this
process segments the others (`Translator.translate`): no line waits for it (`analysed` says None until it is done).
"""

from __future__ import annotations

import atexit
import gc
import multiprocessing
import os
import pickle
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence

from ..errors import UsageError
from ..threads import usable_cores

Batch = list[list[int]]                     # one batch: source ids per sentence
JOB, NEXT = 0, 1                            # the shared count: the job's number, its next batch (then each helper's
                                            # batches taken in this job, then 1 for each helper that has started)
ANALYSE = "analyse"                         # a message to a helper: segment the lines of a file (`Workers.analyse`)


def check_workers(n: int) -> int:
    """`n` if it is a worker count this process can run (1 .. its usable cores), else a UsageError."""
    cores = usable_cores()
    if not 1 <= n <= cores:
        raise UsageError(f"--workers: {n}, outside 1..{cores} (the cores this process may use)", "workers")
    return n


FIXED = 8      # a batch's work beside its source length, in source positions (docs/performance.md: the deal)


def cost(batch: Batch) -> int:
    """A batch's work: its rows times its longest source (what a padded batch computes) plus FIXED (the steps of
    even the shortest sentences, a batch's start and end: a batch of 4-token sources took 117 us a row-position,
    one of 62 tokens 57, at one thread on the default model)."""
    return len(batch) * (max((len(s) for s in batch), default=0) + FIXED)


def costliest_first(batches: Sequence[Batch]) -> list[int]:
    """The order every process takes the batches in: the costliest first, so the job ends on small ones."""
    return sorted(range(len(batches)), key=lambda i: -cost(batches[i]))


class Workers:
    """N - 1 helper processes, each holding a Translator that decodes in-process (`recipe`: a Translator to copy, or
    a function that makes one in the helper: decoding/commands.py `helper_translator`); `decode` shares a job's
    batches with them. `method`: how they start, "spawn" (a fresh interpreter), or "fork" for a process that has
    imported torch but run nothing of it yet (no thread pool to lose; the commands' helpers on Linux)."""

    def __init__(self, recipe, n: int, method: str = "spawn") -> None:
        context = multiprocessing.get_context(method)          # "fork": only before this process has run torch
        helpers = n - 1
        self.key: tuple | None = None          # what they decode with: set by the Translator using them (use_workers)
        self.shared = context.Array("q", 2 + 2 * helpers)        # JOB, NEXT, taken per helper, started per helper
        self.job, self.pipes, self.processes = 0, [], []          # the last request's number (jobs and analyses)
        self.ended = False                                       # a `last` job was sent: the helpers are ending
        self.folder = tempfile.mkdtemp(prefix="glassformer-jobs-")   # each job's batches, written once for all
        self.announced = False                                   # the Translator's note said at the first job
        for k in range(helpers):
            ours, theirs = context.Pipe()
            inherited = [*self.pipes, ours] if method == "fork" else []     # a forked helper holds our ends too
            process = context.Process(target=_serve, args=(theirs, self.shared, k, recipe, warnings.filters,
                                                           inherited), daemon=True)
            process.start()
            theirs.close()
            self.pipes.append(ours)
            self.processes.append(process)
        atexit.register(self.close)            # before multiprocessing's own exit handler, which terminates them

    def decode(self, batches: Sequence[Batch], here: Callable[[Iterable[Batch]], list], beam: int, alpha: float,
               max_length: int | None, stop: str, sentences: int, joining: bool = False,
               last: bool = False) -> list[list[list[int]]]:
        """Target ids per batch, in the order of `batches`; `here`: this process's decoding of the batches it takes
        (an iterable, consumed as it decodes). A helper that fails or ends is a RuntimeError. `joining`: sentences
        join running batches (decoding/joining.py), handed out in the batches' order (shortest first), where the
        costliest first would keep every row's span wide. `last`: no job follows; each helper ends after its reply
        (`close` then finds it gone: a command's exit waited ~0.02 s for it)."""
        order = list(range(len(batches))) if joining else costliest_first(batches)
        job, helpers = [batches[i] for i in order], len(self.pipes)
        self.job += 1
        with self.shared.get_lock():
            self.shared[JOB], self.shared[NEXT] = self.job, 0
            self.shared[2: 2 + helpers] = [0] * helpers
        path = os.path.join(self.folder, f"{self.job}.pickle")       # the pipes carry a line, never block on a
        with open(path, "wb") as f:                                    # helper still starting (a socket holds
            pickle.dump(job, f, protocol=pickle.HIGHEST_PROTOCOL)      # ~200 KB: a job of ~8,000 sentences)
        try:
            self.ended = last
            for pipe in self.pipes:
                pipe.send((self.job, path, beam, alpha, max_length, stop, sentences, last))
            mine: list[int] = []
            found = here(_taken(self.shared, self.job, job, mine))
            out: list = [None] * len(job)
            for i, hyps in zip(mine, found, strict=True):
                out[i] = hyps
            for pipe, n in zip(self.pipes, self.taken(), strict=True):     # the count is spent: no one takes more
                reply = self._reply(pipe) if n else []
                if isinstance(reply, str):
                    raise RuntimeError(reply)
                for i, hyps in reply:
                    out[i] = hyps
        except (EOFError, OSError) as error:
            raise RuntimeError(f"a decoding worker ended ({type(error).__name__})") from error
        finally:
            os.remove(path)                   # a helper that reads it later finds the job's count spent first
        result: list = [None] * len(batches)
        for position, i in enumerate(order):
            result[i] = out[position]
        return result

    def _reply(self, pipe):
        """The helper's reply to this job (replies to earlier jobs it took nothing of are dropped)."""
        while True:
            job, reply = pipe.recv()
            if job == self.job:
                return reply

    def analyse(self, texts: Sequence[str]) -> int | None:
        """Ask the first helper, if it has started, to segment `texts` (source ids per text, from `analysed`): the
        request's number, or None (no helper ready, or they are ending). The texts go in a file, as a job's batches."""
        if self.ended or not self.pipes or not self.started()[0]:
            return None
        self.job += 1
        path = os.path.join(self.folder, f"{self.job}.texts")
        with open(path, "wb") as f:
            pickle.dump(list(texts), f, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self.pipes[0].send((ANALYSE, self.job, path))
        except OSError:                                                    # the helper ended: no answer comes
            return None
        return self.job

    def analysed(self, number: int) -> list[list[int]] | None:
        """Request `number`'s ids if its helper has answered by now, else None (nothing waits; an answer to an
        earlier request is dropped, one that failed or could not segment counts as not there)."""
        pipe = self.pipes[0]
        try:
            while pipe.poll():
                got, reply = pipe.recv()
                if got == number:
                    done, where = reply
                    if not done:
                        return None
                    with open(where, "rb") as f:                          # ours: written by the helper for this
                        return pickle.load(f)                             # request, read here
        except (EOFError, OSError):
            return None
        return None

    def taken(self) -> list[int]:
        """How many batches of the last job each helper took."""
        with self.shared.get_lock():
            return list(self.shared[2: 2 + len(self.pipes)])

    def started(self) -> list[bool]:
        """Whether each helper has made its Translator and waits for jobs."""
        return [bool(self.shared[_started_at(len(self.pipes), k)]) for k in range(len(self.pipes))]

    def close(self) -> None:
        atexit.unregister(self.close)
        started = self.started()
        for pipe in self.pipes:
            pipe.close()
        for process, ready in zip(self.processes, started, strict=True):
            if not ready:                                        # still starting: no package loaded, nothing to wait
                process.kill()
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


def _started_at(helpers: int, helper: int) -> int:
    """Where the shared count keeps whether `helper` (of `helpers`) has started: after JOB, NEXT and the counts."""
    return 2 + helpers + helper


def _taken(shared, number: int, job: list[Batch], taken: list[int], helper: int | None = None) -> Iterator[Batch]:
    """The batches of job `number` this process takes from the shared count, one at a time (their positions appended
    to `taken`); ends when the count is spent or another job began."""
    while True:
        with shared.get_lock():
            i = shared[NEXT]
            if shared[JOB] != number or i >= len(job):
                return
            shared[NEXT] = i + 1
            if helper is not None:
                shared[2 + helper] += 1
        taken.append(i)
        yield job[i]


def _job(shared, number: int, path: str) -> list[Batch] | None:
    """Job `number`'s batches, read from the file the Translator's process wrote, or None when there is nothing
    left of it to take (another job began, its count is spent, or it ended and its file is gone)."""
    with shared.get_lock():
        if shared[JOB] != number:
            return None
    try:
        with open(path, "rb") as f:                                   # ours: written for this job, read here
            job = pickle.load(f)
    except FileNotFoundError:
        return None
    with shared.get_lock():
        return job if shared[JOB] == number and shared[NEXT] < len(job) else None


def _serve(pipe, shared, helper: int, recipe, filters: list, inherited: list = ()) -> None:
    """A helper's start and loop: one intra-op thread, the inductor cache and the warnings filters of the job's
    command, its Translator (a copy, or made by `recipe`); then (job, batches, beam, alpha, max_length, stop,
    sentences, last) in (the batches in a file: their path), (job, [(position, target ids) for each batch it took])
    or (job, one line of error) out, and out of the loop after a `last` job or at the end of the pipe; or (ANALYSE,
    number, a file of texts) in, (number, `_analyse`'s answer) out.
    `inherited`: the other ends of the pipes, which a forked helper closes (else it never hears the end of its own)."""
    for end in inherited:
        end.close()
    import signal

    import torch

    from ..inference.compiler import use_compile_cache

    warnings.filters[:] = filters                         # what the command chose not to print (inductor's, tuning)
    signal.signal(signal.SIGINT, signal.SIG_IGN)          # Ctrl-C is the Translator's process's to answer
    torch.set_num_threads(1)
    try:
        translator = recipe() if callable(recipe) else recipe
    except Exception:                                     # the command's own load says what is wrong, once
        return
    gc.freeze()                          # its model's objects out of the collector's full passes: commands.py
    translator.notes = None              # its remarks (a build, no compiler) are the command's own: said there once
    if translator.compile != "off":
        use_compile_cache(translator.compile_cache)
    translator.threads = 1                                                   # its packages: built for one thread
    shared[_started_at((len(shared) - 2) // 2, helper)] = 1                   # started: closed with a wait
    if translator.expected is not None:                  # what the command's job decodes with, loaded while it waits
        translator.warm(*translator.expected)
    last = False
    while not last:
        try:
            message = pipe.recv()
        except (EOFError, OSError):             # the Translator's process is done
            break
        if message[0] == ANALYSE:
            number, reply = message[1], _analyse(translator, message[2], pipe.poll)
        else:
            number, path, beam, alpha, max_length, translator.stop, sentences, last = message
            taken: list[int] = []
            try:
                job = _job(shared, number, path)                              # None: the job is over
                found = [] if job is None else translator.decode_batches(
                    _taken(shared, number, job, taken, helper), beam, alpha, max_length, sentences)
                reply = list(zip(taken, found, strict=True))
            except Exception as error:                                       # sent back, raised there
                reply = f"a decoding worker failed: {type(error).__name__}: {error}"
        try:
            pipe.send((number, reply))
        except OSError:                                                      # the Translator stopped listening
            return
    translator.close()                  # its packages let go, then out without the interpreter's teardown (~0.7 s
    sys.stderr.flush()                  # with torch)
    os._exit(0)


LOOK_EVERY = 64     # lines a helper segments between two looks at its pipe (`_analyse`)


def _analyse(translator, path: str, moved_on: Callable[[], bool]) -> tuple[bool, str]:
    """A helper's answer to ANALYSE: (True, where) with the source ids of the texts in file `path` written to `where`,
    or (False, why not): a helper without a tokenizer (a copy of a Translator's model), or one whose command has
    `moved_on` (its next message is there: it segmented the lines itself while this helper was busy), looked at
    every LOOK_EVERY lines, so that a late helper goes to the job instead of segmenting lines no one waits for."""
    if translator.source is None:
        return False, "no source tokenizer"
    try:
        with open(path, "rb") as f:                                       # ours: written for this request
            texts = pickle.load(f)
        ids = []
        for start in range(0, len(texts), LOOK_EVERY):
            if moved_on():
                return False, "the command went on without it"
            ids += [translator.source.analyse(text).ids for text in texts[start: start + LOOK_EVERY]]
        with open(path + ".ids", "wb") as f:
            pickle.dump(ids, f, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:                         # the request's folder gone (the job ended without it)
        return False, f"{type(error).__name__}: {error}"
    return True, path + ".ids"

