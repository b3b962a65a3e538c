"""Running a student's code apart: its own process, its own folder, limits, and a watch from outside.

`run_source` starts `python -I -B child.py` (isolated: no PYTHON* variables, no user site, not the
student's folder on sys.path) with a clean environment, in a fresh temporary folder that is its cwd,
HOME and TMPDIR; `run_function` forks the calling process instead (a notebook's function, exactly as
defined there). Either way the child confines itself before any student code runs (child.confine:
rlimits on memory, CPU time, file size, open files, processes; Landlock where the kernel has it) and
answers one JSON line per event on a pipe. Here the parent reads that pipe with a wall clock per phase —
MAX_CODE_LOAD_SECONDS to start and run the file, MAX_CODE_CALL_SECONDS per call, MAX_CODE_TOTAL_SECONDS
in all — and kills the child's whole process group when one runs out. Its stdout and stderr go to files
in the temporary folder (the child keeps MAX_CODE_OUTPUT_BYTES of each); the folder is removed after.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ... import limits as L
from ...errors import UsageError
from . import child

CHILD = Path(child.__file__)
PACKAGE = Path(__file__).resolve().parents[2]          # glassformer/: left out of the student's tracebacks


@dataclass
class Call:
    status: str                        # "done" | "raised"
    result: dict | None = None         # {"arrays": [...]} or {"other": ...}
    error: dict | None = None          # {"type", "message", "lines"}
    seconds: float = 0.0


@dataclass
class Run:
    """What happened to the student's process."""

    calls: list[Call | None]
    load_error: dict | None = None     # the file's top level raised
    missing: bool = False              # the file ran but defines no such function
    loaded: bool = False               # the file ran and its function was found
    stop: str | None = None            # None (it finished) | "timeout" | "crashed"
    cause: str = ""                    # load | call | total | cpu | memory | answer | garbled | signal:NAME | exit:N
    stop_call: int | None = None       # the call running when it stopped (None: while loading)
    stdout: str = ""
    stderr: str = ""
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    contained: dict = field(default_factory=dict)
    seconds: float = 0.0
    dropped: list[int] = field(default_factory=lambda: [0, 0])   # printed bytes beyond MAX_CODE_OUTPUT_BYTES


def limits_now() -> dict:
    return {"memory_bytes": L.MAX_CODE_MEMORY_BYTES, "cpu_seconds": L.MAX_CODE_CPU_SECONDS,
            "write_bytes": L.MAX_CODE_WRITE_BYTES, "open_files": L.MAX_CODE_OPEN_FILES,
            "output_bytes": L.MAX_CODE_OUTPUT_BYTES, "answer_elements": L.MAX_CODE_ANSWER_ELEMENTS}


def _job(calls: list[dict], returns: int, inputs: str, work: str, **more) -> dict:
    return {"calls": calls, "returns": returns, "inputs": inputs, "work": work, "limits": limits_now(),
            "hide": [str(PACKAGE)], **more}


def _posix() -> None:
    if os.name != "posix":
        raise UsageError("checking code needs a POSIX system (Linux, macOS; on Windows use WSL): the student's "
                         "process is confined with resource limits and watched through a pipe")


def run_source(source: str, filename: str, function: str, calls: list[dict], returns: int,
               inputs: str = "numpy") -> Run:
    """Run `function` of the Python source `source` (shown as `filename`) on every call, in a new process."""
    _posix()
    root = tempfile.mkdtemp(prefix="glassformer-code-")
    try:
        work = os.path.join(root, "work")
        os.mkdir(work, 0o700)
        job = _job(calls, returns, inputs, work, source=source, filename=filename, function=function)
        with open(os.path.join(root, "job.json"), "w", encoding="utf-8") as f:
            json.dump(job, f)
        env = {"PATH": os.defpath, "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        read, write = os.pipe()
        try:
            with open(os.path.join(root, "stdout"), "wb") as out, open(os.path.join(root, "stderr"), "wb") as err:
                proc = subprocess.Popen([sys.executable, "-I", "-B", str(CHILD), root, str(write)], cwd=work, env=env,
                                        stdin=subprocess.DEVNULL, stdout=out, stderr=err, pass_fds=(write,),
                                        close_fds=True, start_new_session=True)
        finally:
            os.close(write)
        with os.fdopen(read, "rb", buffering=0) as pipe:
            run = _watch(proc.pid, pipe.fileno(), lambda wait: _wait_popen(proc, wait), len(calls))
        _read_output(run, root)
        return run
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_function(fn, calls: list[dict], returns: int, inputs: str = "numpy") -> Run:
    """Run the function object `fn` on every call in a forked copy of this process (a notebook's kernel:
    the function with everything it reads, as defined there)."""
    _posix()
    if not hasattr(os, "fork"):
        raise UsageError("check_function needs os.fork; save the function in a file and run "
                         "`glassformer exercise check-code FILE --task TASK`")
    root = tempfile.mkdtemp(prefix="glassformer-code-")
    try:
        work = os.path.join(root, "work")
        os.mkdir(work, 0o700)
        job = _job(calls, returns, inputs, work)
        job["limits"]["no_new_processes"] = False
        out = os.open(os.path.join(root, "stdout"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(os.path.join(root, "stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        read, write = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        with warnings.catch_warnings(record=True):                       # "this process is multi-threaded"
            pid = os.fork()
        if pid == 0:                                                      # the child: never returns
            status = 70
            try:
                os.setsid()
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.dup2(out, 1)
                os.dup2(err, 2)
                os.closerange(3, write)                                   # nothing of the kernel's stays open
                os.closerange(write + 1, max(write + 2, os.sysconf("SC_OPEN_MAX")))
                try:
                    import faulthandler
                    faulthandler.disable()
                except (ImportError, RuntimeError):
                    pass
                child.main(job, write, fn)
                status = 0
            finally:
                os._exit(status)
        os.close(write)
        os.close(out)
        os.close(err)
        with os.fdopen(read, "rb", buffering=0) as pipe:
            run = _watch(pid, pipe.fileno(), lambda wait: _wait_pid(pid, wait), len(calls))
        _read_output(run, root)
        return run
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _wait_popen(proc: subprocess.Popen, wait: float) -> int | None:
    try:
        return proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        return None


def _wait_pid(pid: int, wait: float) -> int | None:
    end = time.monotonic() + wait
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return -signal.SIGKILL
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= end:
            return None
        time.sleep(0.01)


def _kill(pid: int) -> None:
    """The child's whole process group (it is the group's leader: start_new_session / setsid)."""
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass


def _watch(pid: int, fd: int, wait, n_calls: int) -> Run:
    """Read the child's events until it ends, or kill it when a wall clock runs out."""
    run = Run(calls=[None] * n_calls)
    start = time.monotonic()
    phase_start, loaded, current, ended, call_start = start, False, None, False, start
    buffer, received = b"", 0

    def _take(event: dict) -> bool:
        """One event of the child; False when it is not one the child sends."""
        nonlocal phase_start, loaded, current, ended, call_start
        kind = event["event"]
        phase_start = time.monotonic()
        if kind == "confined":
            run.contained = event["contained"] if isinstance(event.get("contained"), dict) else {}
        elif kind == "loaded":
            loaded = run.loaded = True
        elif kind == "missing":
            run.missing = True
        elif kind == "start":
            current, call_start = (event["call"] if isinstance(event["call"], int) else None), phase_start
        elif kind in ("done", "raised") and event.get("call") is None:
            run.load_error = _clean_error(event.get("error"))
        elif kind in ("done", "raised"):
            i = event["call"]
            if isinstance(i, int) and 0 <= i < n_calls:
                run.calls[i] = Call(kind, event.get("result"), _clean_error(event.get("error")),
                                    phase_start - call_start)
            current = None
        elif kind == "end":
            ended = True
            run.dropped = [int(n) for n in event.get("dropped", [0, 0])][:2]
        return kind in ("confined", "loaded", "missing", "start", "done", "raised", "end")

    while True:
        now = time.monotonic()
        limit = L.MAX_CODE_CALL_SECONDS if loaded else L.MAX_CODE_LOAD_SECONDS
        left = min(phase_start + limit, start + L.MAX_CODE_TOTAL_SECONDS) - now
        if left <= 0:
            _kill(pid)
            run.stop, run.stop_call = "timeout", current
            run.cause = "total" if start + L.MAX_CODE_TOTAL_SECONDS <= now else "call" if loaded else "load"
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break                                                         # the child closed the pipe
        received += len(chunk)
        if received > L.MAX_CODE_ANSWER_BYTES:
            _kill(pid)
            run.stop, run.cause, run.stop_call = "crashed", "answer", current
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        garbled = False
        for line in lines:
            try:
                garbled = not _take(json.loads(line))
            except (ValueError, TypeError, KeyError, AttributeError):      # not the child's own answer
                garbled = True
            if garbled:
                break
        if garbled:
            _kill(pid)
            run.stop, run.cause, run.stop_call = "crashed", "garbled", current
            break
        if ended:                                # every call answered: what it does on its way out is not judged
            break
    code = wait(2.0)                                                      # let it exit, else it is killed
    if code is None:
        _kill(pid)
        code = wait(5.0)
    _kill(pid)                                                            # anything it left in its group
    run.seconds = time.monotonic() - start
    if run.stop is None and not ended and run.load_error is None and not run.missing:
        run.stop, run.stop_call = "crashed", current
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
            run.cause = "cpu" if name == "SIGXCPU" else f"signal:{name}"
            if name == "SIGXCPU":
                run.stop = "timeout"
        else:
            run.cause = f"exit:{code}"
    return run


def _clean_error(error) -> dict | None:
    """The child's description of an exception, kept to its expected fields and types (the child is untrusted)."""
    if error is None:
        return None
    error = error if isinstance(error, dict) else {}
    lines = [e for e in error.get("lines", []) if isinstance(e, dict)] if isinstance(error.get("lines"), list) else []
    return {"type": str(error.get("type", "?"))[:100], "message": str(error.get("message", ""))[:1000],
            "lines": [{"file": str(e.get("file", "")), "line": e.get("line") if isinstance(e.get("line"), int) else 0,
                       "function": str(e.get("function", "")), "text": str(e.get("text", ""))[:200]}
                      for e in lines[-10:]]}


def _read_output(run: Run, root: str) -> None:
    for name, dropped in zip(("stdout", "stderr"), run.dropped, strict=True):
        path = os.path.join(root, name)
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                text = f.read(L.MAX_CODE_OUTPUT_BYTES).decode("utf-8", "replace")
        except OSError:
            size, text = 0, ""
        setattr(run, name, text)
        setattr(run, f"{name}_bytes", size + dropped)
