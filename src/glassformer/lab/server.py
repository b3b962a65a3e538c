"""The lab's local HTTP server: the packaged static page plus the JSON API, on Starlette and uvicorn.

Every endpoint is a Starlette `Route`: one per row of `LabAPI.ROUTES` and one per static file.
Hardening, in the order a request meets it:
- the connection (connection.py): at most MAX_CONNECTIONS open (more get 503); the request head must
  arrive within HEAD_TIMEOUT seconds and the body within BODY_TIMEOUT (a client trickling bytes is cut
  off); idle keep-alive connections close after KEEP_ALIVE seconds; Ctrl-C stops the server within
  about a second, slow clients or not (GRACE);
- the head (guards.HeadLimits): path over MAX_PATH bytes 414, headers over MAX_HEADER_BYTES or MAX_HEADERS
  431, an unknown method 501;
- the Host header (guards.OwnHostOnly: Starlette's TrustedHostMiddleware plus the port) must be one of
  127.0.0.1, localhost, [::1] with the server's port (DNS rebinding), else 403; binding another address
  needs `expose=True` (`glassformer lab --expose`), which adds the bound address and any names given;
- the routes: an unknown path 404, a method the path does not take 405 (with Allow);
- a POST must be application/json (415), with a Content-Length (411) of at most MAX_BODY bytes,
  judged before the body is read (413), from the page's own origin (403); the body is read by
  glassformer.validation.load_json (400 for bad encoding, syntax, nesting, huge integers, lone
  surrogates, a key named twice in one object);
- the work itself runs in a worker thread: the model's work and the claims in WORKERS threads, the page's
  files and the light GETs (QUICK_ROUTES) in QUICK_WORKERS threads of their own, so /api/info and the
  page answer while every model thread waits; a request whose client has gone is dropped before its work
  starts (checked every DISCONNECT_POLL seconds while it waits); an answer its client does not read
  within WRITE_TIMEOUT (connection.py) is cut off; a UsageError becomes its status with {"error",
  "field"}; a bug a 500 and one log line.
Every answer, errors included, is JSON {"error", "field"} with the security headers.
Only the regular files found in the static folder at start-up are ever served (a fixed table of routes,
so `..`, encoded dots, absolute paths and symlinks simply are not in it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import re
import socket
import stat
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ..errors import UsageError
from ..validation import load_json
from .api import LabAPI
from .connection import JSON_TYPE, MAX_HEAD_BUFFER, LabProtocol
from .guards import SECURITY_HEADERS, HeadLimits, OwnHostOnly, error_response, json_bytes

STATIC_DIR = Path(__file__).resolve().parent / "static"
MAX_BODY = 1 << 20                   # bytes of one request body (1 MiB)
WORKERS = 8                          # threads that run API work (the model itself runs one at a time)
QUICK_WORKERS = 2                    # threads that read the page's files and answer QUICK_ROUTES
QUICK_ROUTES = frozenset({"info", "block", "masks"})   # GETs that never wait for the model's lock
KEPT_ROUTES = frozenset({"bundle"})                   # answers the API makes once and hands out again
STREAM_CHUNK = 1 << 20               # bytes of a large answer written at a time (the 31 MB bundle)
DISCONNECT_POLL = 0.25               # seconds between two looks at whether a waiting request's client left
BODY_TIMEOUT = 10.0                  # seconds for a whole request body to arrive
KEEP_ALIVE = 5                       # seconds an idle keep-alive connection stays open
GRACE = 1.0                          # seconds requests in flight get after Ctrl-C
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json; charset=utf-8",
    ".svg": "image/svg+xml; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
HOST_NAME = re.compile(r"[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?|\[[0-9a-f:.]+\]", re.IGNORECASE)   # for --allow-host
log = logging.getLogger("glassformer.lab")


def static_table(folder: str | Path = STATIC_DIR) -> dict[str, Path]:
    """URL path -> file for every regular, non-symlinked file under `folder` ("/" -> index.html).

    Nothing else is ever served: the table is the whole allow-list.
    """
    root = Path(folder)
    table: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink() and not d.startswith(".")]
        for name in filenames:
            path = Path(dirpath) / name
            if name.startswith(".") or path.suffix not in CONTENT_TYPES or "{" in name or "}" in name:
                continue                                   # (braces would be route parameters)
            if not stat.S_ISREG(os.lstat(path).st_mode):          # symlinks and specials are skipped
                continue
            table["/" + path.relative_to(root).as_posix()] = path
    if "/index.html" in table:
        table["/"] = table["/index.html"]
    return table


def is_loopback(host: str) -> bool:
    """Whether a bind address is this machine only."""
    return host in ("127.0.0.1", "localhost", "::1", "[::1]")


class WorkerPool:
    """A fixed number of daemon threads running blocking work for the event loop.

    Daemon threads, unlike a ThreadPoolExecutor's, do not hold the process after Ctrl-C while a long
    computation (/api/verify) is still running: the server stops within GRACE seconds regardless.
    """

    def __init__(self, size: int = WORKERS) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.size = size
        for i in range(size):
            threading.Thread(target=self._work, name=f"glassformer-lab-worker-{i}", daemon=True).start()

    def close(self) -> None:
        """Each thread ends once it has finished what it holds (the server has stopped)."""
        for _ in range(self.size):
            self._jobs.put(None)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, future, fn, args = job
            if future.cancelled():                     # its client left while it waited: not started
                continue
            try:
                outcome = (fn(*args), None)
            except Exception as error:  # handed to the awaiting request, which answers it
                outcome = (None, error)
            try:
                loop.call_soon_threadsafe(_settle, future, *outcome)
            except RuntimeError:                       # the loop has closed (server stopped): drop it
                pass

    async def run(self, fn, *args):
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((loop, future, fn, args))
        return await future


def _settle(future: asyncio.Future, result, error) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


# ---- the endpoints ---------------------------------------------------------------------------------
def api_route(api: LabAPI, pool: WorkerPool, method: str, path: str, name: str) -> Route:
    """A row of LabAPI.ROUTES as a Starlette route: the body (POST) checked and read, the work in a worker.
    An answer the API keeps and hands out again (the bundle: KEPT_ROUTES) is encoded once (`kept`)."""
    work, kept = getattr(api, name), Kept() if name in KEPT_ROUTES else None

    async def endpoint(request: Request) -> Response:
        args = (await read_json_body(request),) if method == "POST" else ()
        job = asyncio.ensure_future(pool.run(_answer, work, args, kept))   # the JSON written in the worker too
        while not (await asyncio.wait({job}, timeout=DISCONNECT_POLL))[0]:
            if await request.is_disconnected():        # nobody to answer: a job not yet started never starts
                job.cancel()
                return Response(status_code=499)
        return job.result()

    return Route(path, endpoint, methods=[method], name=name)


class Kept:
    """The last answer of a route and its JSON bytes: the same object again is not encoded again."""

    def __init__(self) -> None:
        self.payload, self.body, self.lock = None, b"", threading.Lock()

    def encode(self, payload) -> bytes:
        with self.lock:
            if payload is not self.payload:
                self.payload, self.body = payload, json_bytes(payload)
            return self.body


def _answer(work, args: tuple, kept: Kept | None) -> Response:
    """200 and the JSON of `work(*args)`; an answer over STREAM_CHUNK bytes is sent a chunk at a time, each after
    the client has taken the one before (uvicorn's flow control), so a client that does not read holds one chunk."""
    payload = work(*args)
    body = json_bytes(payload) if kept is None else kept.encode(payload)
    headers = {**SECURITY_HEADERS, "Content-Length": str(len(body))}
    if len(body) <= STREAM_CHUNK:
        return Response(body, 200, headers=SECURITY_HEADERS, media_type=JSON_TYPE)
    return StreamingResponse(_chunks(memoryview(body)), 200, headers=headers, media_type=JSON_TYPE)


async def _chunks(view: memoryview):
    for start in range(0, len(view), STREAM_CHUNK):
        yield view[start: start + STREAM_CHUNK]


def static_route(pool: WorkerPool, path: str, file: Path) -> Route:
    """One file of the static table as a GET route."""
    media_type = CONTENT_TYPES[file.suffix]

    async def endpoint(request: Request) -> Response:
        try:
            data = await pool.run(file.read_bytes)
        except OSError:
            raise HTTPException(404) from None
        return Response(data, 200, headers=SECURITY_HEADERS, media_type=media_type)

    return Route(path, endpoint, methods=["GET"])


def _same_origin(headers: Headers) -> bool:
    """A browser's cross-site POST carries a foreign Origin: refuse it (the page's own fetch is same-origin)."""
    origin = headers.get("origin")
    if origin is None:
        return True
    parts = urlsplit(origin)
    return parts.scheme == "http" and parts.netloc.lower() == headers.get("host", "").strip().lower()


async def read_json_body(request: Request) -> Any:
    """The JSON body of a POST; every size and type check comes before reading it (UsageError, its status)."""
    headers = request.headers
    if not _same_origin(headers):
        raise UsageError("cross-origin requests are not accepted", "origin", status=403)
    kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != "application/json":
        raise UsageError("send the body as Content-Type: application/json", "content-type", status=415)
    if "transfer-encoding" in headers:
        raise UsageError("send the body with a Content-Length (chunked bodies are not accepted)", "body", status=411)
    length = headers.get("content-length", "0").strip()
    if not length.isdigit() or len(length) > 18:
        raise UsageError(f"Content-Length is not a number: {length[:40]!r}", "body")
    if int(length) > MAX_BODY:
        raise UsageError(f"request body is {int(length)} bytes; the limit is {MAX_BODY}", "body", status=413)
    try:
        raw = await asyncio.wait_for(request.body(), BODY_TIMEOUT)
    except asyncio.TimeoutError:
        raise UsageError(f"the request body did not arrive within {BODY_TIMEOUT:g} s", "body", status=408) from None
    except ClientDisconnect:
        raise UsageError("the connection closed before the body was complete", "body") from None
    if not raw.strip():
        raise UsageError("request body is empty; send a JSON object", "body")
    try:
        return load_json(raw, "request body")
    except UsageError as error:
        raise UsageError(str(error), error.field or "body") from None


# ---- errors: every one a JSON answer -----------------------------------------------------------------
def usage_error(request: Request, error: UsageError) -> Response:
    """Bad input anywhere (body, field, limit): its status, its one-line message, its field."""
    return error_response(error.status, str(error), error.field)


def routing_error(request: Request, error: HTTPException) -> Response:
    """No route for the path (404) or not for this method (405, with Starlette's Allow header)."""
    if error.status_code == 405:
        return error_response(405, f"method {request.method} is not allowed", "method", error.headers)
    if error.status_code == 404:
        return error_response(404, "not found", "path")
    return error_response(error.status_code, str(error.detail), None, error.headers)


def internal_error(request: Request, error: Exception) -> Response:
    """A bug, not bad input: one line in the log and in the answer."""
    log.error("internal error on %s %s: %s: %s", request.method, request.url.path[:200], type(error).__name__, error)
    return error_response(500, f"internal error: {type(error).__name__}", None)


class LabApp:
    """The ASGI application: Starlette's routes behind HeadLimits and OwnHostOnly, every answer JSON."""

    def __init__(self, api: LabAPI, static: dict[str, Path], host_names: set[str], port: int) -> None:
        self.api, self.static = api, static
        self.pool, self.quick = WorkerPool(WORKERS), WorkerPool(QUICK_WORKERS)
        routes = [*(api_route(api, self.quick if row[2] in QUICK_ROUTES else self.pool, *row) for row in api.ROUTES),
                  *(static_route(self.quick, path, file) for path, file in static.items())]
        self.starlette = Starlette(
            routes=routes,
            middleware=[Middleware(HeadLimits), Middleware(OwnHostOnly, names=host_names, port=port)],
            exception_handlers={UsageError: usage_error, HTTPException: routing_error, Exception: internal_error})
        self.starlette.router.redirect_slashes = False      # /api/info/ is not /api/info: only the table

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":                   # lifespan is off; websockets are not served
            return
        try:
            await self.starlette(scope, receive, send)
        except Exception:  # internal_error has answered and logged it; Starlette re-raises it
            pass           # for the server, which would print a traceback


class LabServer:
    """A bound socket and the uvicorn server that will serve the lab on it."""

    def __init__(self, address: tuple[str, int], api: LabAPI, static_dir: str | Path = STATIC_DIR,
                 quiet: bool = True, *, expose: bool = False, allow_hosts: tuple[str, ...] = ()) -> None:
        host, port = address
        if not is_loopback(host) and not expose:
            raise UsageError(f"--host {host}: binding an address other than loopback needs --expose "
                             "(anyone who can reach it can run computations on this machine)")
        for name in allow_hosts:
            if not HOST_NAME.fullmatch(name):
                raise UsageError(f"--allow-host {name!r}: give a host name (letters, digits, dots, hyphens; no "
                                 "port, no *) or a bracketed IPv6 address", "allow-host")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host.strip("[]"), port))
            self.socket.listen(128)
        except OSError:
            self.socket.close()
            raise
        self.socket.set_inheritable(True)
        self.server_address = self.socket.getsockname()[:2]
        self.api, self.quiet = api, quiet
        bound = self.server_address[1]
        names = set(LOOPBACK_NAMES) | ({f"[{host}]" if ":" in host else host} if expose else set()) | set(allow_hosts)
        self.allowed_hosts = {f"{name.lower()}:{bound}" for name in names}      # Host headers answered
        self.app = LabApp(api, static_table(static_dir), {name.lower() for name in names}, bound)
        config = uvicorn.Config(self.app, http=LabProtocol, ws="none", lifespan="off", log_config=None,
                                access_log=not quiet, log_level="warning" if quiet else "info",
                                server_header=False, date_header=False, timeout_keep_alive=KEEP_ALIVE,
                                timeout_graceful_shutdown=GRACE, h11_max_incomplete_event_size=MAX_HEAD_BUFFER)
        self._uvicorn = uvicorn.Server(config)
        self._stopped = threading.Event()

    @property
    def url(self) -> str:
        host, port = self.server_address
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/"

    def serve_forever(self) -> None:
        """Serve until shutdown() (another thread) or Ctrl-C (main thread: KeyboardInterrupt afterwards)."""
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self.app.pool.close()
            self.app.quick.close()
            self._stopped.set()

    def stop_soon(self, *_signal) -> None:
        """Ask the server to stop, waiting for nothing (a SIGINT handler: before serving, it then stops at once)."""
        self._uvicorn.should_exit = True

    def shutdown(self) -> None:
        """Stop serving (from another thread) and wait until the server has finished."""
        self.stop_soon()
        self._stopped.wait(timeout=10)

    def server_close(self) -> None:
        self.socket.close()


def make_server(api: LabAPI | None = None, host: str = "127.0.0.1", port: int = 8765, *,
                static_dir: str | Path = STATIC_DIR, quiet: bool = True, expose: bool = False,
                allow_hosts: tuple[str, ...] = ()) -> LabServer:
    """A bound, not yet serving, lab server (port 0 = an ephemeral port; see `.url`)."""
    return LabServer((host, port), api if api is not None else LabAPI(), static_dir, quiet, expose=expose,
                     allow_hosts=allow_hosts)


def serve_in_thread(server: LabServer) -> threading.Thread:
    """Serve in a background thread (tests, notebooks); stop with server.shutdown(); server.server_close()."""
    thread = threading.Thread(target=server.serve_forever, name="glassformer-lab", daemon=True)
    thread.start()
    return thread
