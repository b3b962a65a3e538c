"""A benchmark worker: one system in its own process, spoken to over JSON lines (one request per line on
stdin, one reply per line on stdout), and the environment every worker gets. Shared by benchmarks.run and
benchmarks.race; standard library only (a worker's own peak RSS starts small)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent           # the tree whose src/ a worker imports by default
WAIT_POLICY = "PASSIVE"                                 # benchmarks.run's: glassformer against itself
WAIT_POLICIES = ("default", "PASSIVE", "ACTIVE")


def child_env(threads: int, src: str | None = None, wait_policy: str = WAIT_POLICY) -> dict:
    """The same environment for every worker. `wait_policy` is OMP_WAIT_POLICY ("default": the variable
    removed, OpenMP's own policy, what a user gets). PASSIVE: idle OpenMP threads sleep instead of spinning,
    so on a machine busy with other work a parallel region does not wait on a descheduled thread (with the
    default policy, 2 threads on 2 busy cores ran 10-100x slower); it makes every parallel region wake a
    sleeping thread, which costs a system in proportion to its number of parallel regions, not its work."""
    if wait_policy not in WAIT_POLICIES:
        raise ValueError(f"wait_policy: {wait_policy!r} is not one of {', '.join(WAIT_POLICIES)}")
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false",
               TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    env.pop("OMP_WAIT_POLICY", None)
    if wait_policy != "default":
        env["OMP_WAIT_POLICY"] = wait_policy
    src = src or str(ROOT / "src")
    env["PYTHONPATH"] = src + os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else src
    return env


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
