"""A benchmark worker: one system in its own process, spoken to over JSON lines (one request per line on
stdin, one reply per line on stdout). Shared by benchmarks.run and benchmarks.race."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path


class JsonWorker:
    """Start `cmd`; `call(request)` writes one JSON line and reads one back. A reply with "error", or a worker
    that stops, is a RuntimeError carrying the end of the worker's stderr (kept in a temporary file)."""

    def __init__(self, name: str, cmd: list[str], cwd: Path, env: dict, quit_request: dict) -> None:
        self.name, self.quit_request = name, quit_request
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, cwd=cwd, env=env)

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.log.seek(0)
            tail = self.log.read()[-2000:]
            raise RuntimeError(f"worker {self.name} stopped (exit status {self.proc.wait()}):\n{tail}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"worker {self.name}: {reply['error']}")
        return reply

    def call(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps(self.quit_request) + "\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
            self.proc.wait(timeout=60)
        self.log.close()
