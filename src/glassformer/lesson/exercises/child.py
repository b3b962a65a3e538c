"""The process that runs a student's code: confined first, then the file, then one call per probe.

The checker starts this file as a script, `python -I -B child.py ROOT FD` (ROOT holds job.json; FD is the
pipe it answers on), or enters `main(job, fd, fn)` in a forked copy of a notebook's kernel. Either way it
imports the standard library and NumPy only — never glassformer (nor may the student's code: an import of it
fails), never torch unless the student's code does — and sends one JSON line per event on FD:

    {"event": "confined", "contained": {...}}      what `confine` could apply
    {"event": "loaded"}                             the file ran; its function is there
    {"event": "missing"}                            the file ran but defines no such function
    {"event": "start", "call": i}
    {"event": "done", "call": i, "result": {"arrays": [{"shape", "dtype", "values"}]} | {"other": ...}}
    {"event": "raised", "call": i | null, "error": {"type", "message", "lines": [{file, line, function, text}]}}
    {"event": "end"}

Nothing the student's code raises leaves `main`; a crash or a hang is seen by the checker from outside.
"""

from __future__ import annotations

import io
import json
import linecache
import os
import sys
import sysconfig
import traceback
import types

# Landlock (Linux ≥ 5.13): filesystem rights a process can drop without privileges.
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446
# write_file, remove_dir, remove_file, make_char, make_dir, make_reg, make_sock, make_fifo, make_block, make_sym
_FS_WRITE = sum(1 << bit for bit in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))
_FS_REFER, _FS_TRUNCATE = 1 << 13, 1 << 14                              # ABI 2, ABI 3
_NET_TCP = 1 | 2                                                        # ABI 4: bind, connect
_SCOPE = 1 | 2                                                          # ABI 6: abstract unix sockets, signals


# ---- confinement -----------------------------------------------------------------------------------


def confine(work: str, limits: dict) -> dict:
    """Set the process's resource limits and drop the right to write outside `work` where Landlock exists.
    Returns what was applied: {"rlimits": {...}, "landlock": abi}."""
    applied: dict = {"rlimits": {}, "landlock": 0}
    try:
        import resource
    except ImportError:                                                  # not a POSIX system: wall clocks only
        return applied

    def cap(name: str, value: int, slack: int = 0) -> None:
        which = getattr(resource, name, None)
        if which is None:
            return
        _, hard = resource.getrlimit(which)
        high = value + slack if hard == resource.RLIM_INFINITY else min(value + slack, hard)
        try:
            resource.setrlimit(which, (min(value, high), high))
            applied["rlimits"][name] = min(value, high)
        except (ValueError, OSError):
            pass

    cap("RLIMIT_CORE", 0)
    cap("RLIMIT_AS", _address_space() + limits["memory_bytes"])
    cap("RLIMIT_CPU", limits["cpu_seconds"], slack=1)                    # SIGXCPU, then SIGKILL a second later
    cap("RLIMIT_FSIZE", limits["write_bytes"])
    cap("RLIMIT_NOFILE", limits["open_files"])
    if limits.get("no_new_processes", True):                             # not for root; not in a fork of a kernel,
        cap("RLIMIT_NPROC", 0)                                           # whose thread pools start again there
    applied["landlock"] = _landlock(work)
    return applied


def _address_space() -> int:
    """The process's address space now, in bytes (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _landlock(work: str) -> int:
    """Writing, creating, removing and renaming allowed beneath `work` only (and, from ABI 4, no TCP; from
    ABI 6, no signal to a process outside). Returns the Landlock ABI applied, 0 when none could be."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
        syscall.restype = ctypes.c_long
        abi = syscall(_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
        if abi < 1:
            return 0
        write = _FS_WRITE | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)

        class Ruleset(ctypes.Structure):
            _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

        class PathBeneath(ctypes.Structure):
            _pack_ = 1
            _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

        attr = Ruleset(write, _NET_TCP if abi >= 4 else 0, _SCOPE if abi >= 6 else 0)
        size = 8 if abi < 4 else 16 if abi < 6 else 24
        ruleset = syscall(_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
        if ruleset < 0:
            return 0
        try:
            folder = os.open(work, getattr(os, "O_PATH", os.O_RDONLY) | os.O_CLOEXEC)
            try:
                rule = PathBeneath(write, folder)
                if syscall(_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule),
                           ctypes.c_uint32(0)) != 0:
                    return 0
            finally:
                os.close(folder)
            if libc.prctl(38, 1, 0, 0, 0) != 0:                          # PR_SET_NO_NEW_PRIVS
                return 0
            if syscall(_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
                return 0
        finally:
            os.close(ruleset)
        return int(abi)
    except (OSError, AttributeError, ValueError):
        return 0


class _Capped(io.TextIOBase):
    """sys.stdout / sys.stderr of the student's code: the first `cap` bytes reach the file, the rest is counted."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd, self.left, self.dropped = fd, cap, 0

    def writable(self) -> bool:
        return True

    def write(self, text) -> int:
        data = str(text).encode("utf-8", "replace")
        keep = data[: max(self.left, 0)]
        self.left -= len(keep)
        self.dropped += len(data) - len(keep)
        while keep:
            try:
                keep = keep[os.write(self.fd, keep):]
            except OSError:
                break
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


# ---- the run ---------------------------------------------------------------------------------------


class _WithoutGlassformer:
    """A meta path finder: the code checked here writes its function itself; glassformer's own reference (and
    the rest of it) cannot be imported (what a notebook imported before its check stays its own)."""

    def find_spec(self, name, path=None, target=None):
        if name == "glassformer" or name.startswith("glassformer."):
            raise ModuleNotFoundError(f"No module named {name!r} in the checked code: write the function with "
                                      "NumPy (or torch) yourself", name=name)
        return None


def main(job: dict, fd: int, fn=None) -> None:
    """The start of the student's process (a script's, or a fork's of a notebook's kernel): its folder is its
    cwd, HOME and TMPDIR, its output capped, its limits set; then the file is run (unless `fn` is given) and
    every call of the job answered on `fd`. Returns normally whatever the student's code does."""
    import numpy as np

    def send(event: dict) -> None:
        data = (json.dumps(event, allow_nan=True) + "\n").encode()
        while data:
            data = data[os.write(fd, data):]

    work = job["work"]
    os.chdir(work)
    for name in ("HOME", "TMPDIR", "TMP", "TEMP"):
        os.environ[name] = work
    if "tempfile" in sys.modules:
        sys.modules["tempfile"].tempdir = work
    sys.stdout = _Capped(1, job["limits"]["output_bytes"])
    sys.stderr = _Capped(2, job["limits"]["output_bytes"])
    sys.stdin = io.StringIO("")
    hidden = [os.path.abspath(p) for p in job.get("hide", [])] + [os.path.abspath(__file__)]
    hidden += sorted({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})
    send({"event": "confined", "contained": confine(work, job["limits"])})
    sys.meta_path.insert(0, _WithoutGlassformer())
    if fn is None:
        source, filename = job["source"], job["filename"]
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        module = types.ModuleType("__student__")
        module.__file__ = filename
        try:
            exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)
        except BaseException as error:                                   # noqa: B036 — sys.exit is theirs too
            send({"event": "raised", "call": None, "error": describe(error, hidden)})
            return
        fn = module.__dict__.get(job["function"])
        if not callable(fn):
            send({"event": "missing"})
            return
    send({"event": "loaded"})
    torch = None
    if job.get("inputs") == "torch":
        try:
            import torch
        except BaseException as error:                                   # noqa: B036
            send({"event": "raised", "call": None, "error": describe(error, hidden)})
            return
    if "torch" in sys.modules:
        try:
            sys.modules["torch"].set_num_threads(1)                      # no thread pool: one core, no fork hazard
        except BaseException:                                            # noqa: B036
            pass
    limit = job["limits"]["answer_elements"]
    for i, call in enumerate(job["calls"]):
        args, kwargs = decode(call["args"], np, torch), decode(call["kwargs"], np, torch)
        send({"event": "start", "call": i})
        try:
            value = fn(*args, **kwargs)
        except BaseException as error:                                   # noqa: B036
            send({"event": "raised", "call": i, "error": describe(error, hidden)})
            continue
        try:
            result = encode(value, job["returns"], np, limit)
        except BaseException as error:                                   # noqa: B036
            result = {"other": f"an unreadable result ({type(error).__name__}: {error})"[:300]}
        send({"event": "done", "call": i, "result": result})
    send({"event": "end", "dropped": [sys.stdout.dropped, sys.stderr.dropped]
          if isinstance(sys.stdout, _Capped) and isinstance(sys.stderr, _Capped) else [0, 0]})


def decode(obj, np, torch=None):
    """The job's JSON back to arrays: {"__array__": nested lists, "dtype": ...} becomes a fresh ndarray (or a
    torch tensor when the job asks for torch inputs), so no call sees what an earlier one changed."""
    if isinstance(obj, dict):
        if "__array__" in obj:
            a = np.array(obj["__array__"], dtype=obj["dtype"])
            return torch.from_numpy(a) if torch is not None else a
        return {k: decode(v, np, torch) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v, np, torch) for v in obj]
    return obj


def encode(value, returns: int, np, limit: int) -> dict:
    """What a call returned: {"arrays": [...]} when it is the `returns` arrays the task asks for (a torch
    tensor read through .detach().cpu()), else {"other": a short description}."""
    if returns > 1:
        if not isinstance(value, (tuple, list)) or len(value) != returns:
            count = len(value) if isinstance(value, (tuple, list)) else None
            return {"other": _what(value, np), "count": count}
        items = list(value)
    else:
        items = [value]
    arrays = []
    for item in items:
        if hasattr(item, "detach") and hasattr(item, "cpu"):                # a torch tensor
            item = item.detach().cpu()
            if str(getattr(item, "dtype", "")) == "torch.bfloat16":
                item = item.float()
            item = item.numpy()
        if item is None or isinstance(item, (str, bytes, dict)):
            return {"other": _what(item, np)}
        try:
            a = np.asarray(item)
        except (ValueError, TypeError):
            return {"other": _what(item, np)}
        if a.dtype.kind not in "biuf":
            return {"other": _what(item, np), "shape": list(a.shape), "dtype": str(a.dtype)}
        entry = {"shape": list(a.shape), "dtype": str(a.dtype)}
        if a.size <= limit:
            entry["values"] = (a if a.dtype.kind == "b" else a.astype(np.float64)).tolist()
        arrays.append(entry)
    return {"arrays": arrays}


def _what(value, np) -> str:
    if value is None:
        return "None"
    if isinstance(value, (tuple, list)):
        parts = []
        for v in value[:4]:
            shape = getattr(v, "shape", None)
            parts.append(f"{type(v).__name__} {tuple(shape)}" if shape is not None else type(v).__name__)
        more = ", ..." if len(value) > 4 else ""
        return f"a {type(value).__name__} of {len(value)}: ({', '.join(parts)}{more})"
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"one array of shape {tuple(shape)}"
    return f"a value of type {type(value).__name__}"


def describe(error: BaseException, hidden: list[str]) -> dict:
    """An exception as the student should read it: its type, message, and the lines of their own code only
    (frames in the standard library, site-packages, glassformer or this file are left out)."""
    lines = []
    for frame, lineno in traceback.walk_tb(error.__traceback__):
        name = frame.f_code.co_filename
        path = os.path.abspath(name) if not name.startswith("<") else name
        if name.startswith("<frozen") or any(path == h or path.startswith(h.rstrip(os.sep) + os.sep)
                                             for h in hidden):
            continue
        text = linecache.getline(name, lineno, frame.f_globals).strip()
        lines.append({"file": name, "line": lineno, "function": frame.f_code.co_name, "text": text[:200]})
    if isinstance(error, SystemExit):
        message = f"sys.exit({error.code!r})"
    else:
        try:
            message = str(error)
        except BaseException:                                            # noqa: B036
            message = "(its message could not be read)"
    if isinstance(error, SyntaxError) and error.lineno:
        lines.append({"file": error.filename or "", "line": error.lineno, "function": "",
                      "text": (error.text or "").strip()[:200]})
    return {"type": type(error).__name__, "message": message[:1000], "lines": lines[-10:]}


if __name__ == "__main__":
    with open(os.path.join(sys.argv[1], "job.json"), encoding="utf-8") as f:
        main(json.load(f), int(sys.argv[2]))
