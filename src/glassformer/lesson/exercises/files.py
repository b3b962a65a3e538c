"""Reading a file a user names: a regular file only, and no more bytes than its named limit.

A FIFO or a device (/dev/zero, /dev/stdin) would block or never end: it is opened without blocking and
refused in one line before a byte is read.
"""

from __future__ import annotations

import os
import stat

from ... import limits
from ...errors import UsageError

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
