"""Reading a file a user names: a regular file only, and no more bytes than its named limit; a student's
code file also compiled (nothing of it runs here) and searched for the task's function.

A FIFO or a device (/dev/zero, /dev/stdin) would block or never end: it is opened without blocking and
refused in one line before a byte is read.
"""

from __future__ import annotations

import ast
import os
import stat

from ... import limits
from ...errors import UsageError
from .tasks import TASKS, Task

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def read_regular(path: str, limit: str, what: str) -> bytes:
    """The bytes of the regular file `path`, at most the limit named `limit` (e.g. "MAX_SHEET_FILE_BYTES")."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
            raise UsageError(f"{path}: {what}: not a regular file ({kind})")
        limits.check(f"{path}: size in bytes", info.st_size, limit, what)
        bound = getattr(limits, limit) if limits.enforced() else info.st_size
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(bound + 1)
        limits.check(f"{path}: size in bytes", len(raw), limit, what)       # grew while being read
        return raw
    finally:
        os.close(fd)


def task_of(name: str) -> Task:
    if name not in TASKS:
        raise UsageError(f"--task: unknown task {name!r} (one of: {', '.join(TASKS)})", "task")
    return TASKS[name]


def read_source(path: str, task: Task) -> str:
    """A student's file as text, refused in one line when it cannot be their answer: not a regular file,
    over MAX_CODE_FILE_BYTES, not UTF-8, not Python (the line of the syntax error), or without the function."""
    raw = read_regular(path, "MAX_CODE_FILE_BYTES", "code")
    try:
        source = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise UsageError(f"{path}: not Python: not UTF-8 text (byte 0x{raw[error.start]:02x} at offset "
                         f"{error.start})") from None
    check_python(source, path, task)
    return source


def check_python(source: str, where: str, task: Task) -> None:
    """Compile (nothing runs) and find the task's function at the top level; else one UsageError line."""
    try:
        tree = ast.parse(source, where)
        compile(tree, where, "exec", dont_inherit=True)
    except SyntaxError as error:
        raise UsageError(f"{where}: not Python: line {error.lineno}: {error.msg}") from None
    except (ValueError, RecursionError, MemoryError) as error:
        reason = "it holds a NUL byte" if isinstance(error, ValueError) else "it is nested too deeply"
        raise UsageError(f"{where}: not Python: {reason}") from None
    if task.function not in _top_level_names(tree):
        raise UsageError(f"{where}: no function {task.function}() at the top level (task {task.name} asks for "
                         f"def {task.function}({task.signature}))")


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            names |= _top_level_names(ast.Module(body=list(ast.iter_child_nodes(node)), type_ignores=[]))
    return names
