"""The lab's local HTTP server: the packaged static page plus the JSON API, on Starlette and uvicorn.

Hardening, in the order a request meets it:
- the connection: at most MAX_CONNECTIONS open (more get 503); the request head must arrive within
  HEAD_TIMEOUT seconds and the body within BODY_TIMEOUT (a client trickling bytes is cut off); idle
  keep-alive connections close after KEEP_ALIVE seconds; Ctrl-C stops the server within about a
  second, slow clients or not (GRACE);
- the head: path over MAX_PATH bytes 414, headers over MAX_HEADER_BYTES or MAX_HEADERS 431, an
  unknown method 501, a known one the path does not take 405, every answer JSON {"error", "field"};
- the Host header must be one of 127.0.0.1, localhost, [::1] with the server's port (DNS rebinding);
  binding another address needs `expose=True` (`glassformer lab --expose`), which adds the bound
  address and any names given to the allow-list;
- a POST must be application/json (415), with a Content-Length (411) of at most MAX_BODY bytes,
  judged before the body is read (413), from the page's own origin (403); the body is read by
  glassformer.validation.load_json (400 for bad encoding, syntax, nesting, huge integers, lone
  surrogates);
- the work itself runs in a worker thread (the event loop keeps answering /api/info while /api/verify
  computes); an ApiError or UsageError becomes its status with {"error", "field"}; a bug a 500 line.
Only the regular files found in the static folder at start-up are ever served (a fixed table, so
`..`, encoded dots, absolute paths and symlinks simply are not in it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import socket
import stat
import threading
from pathlib import Path
from urllib.parse import urlsplit

import uvicorn
from starlette.responses import Response

from ..errors import UsageError
from ..validation import load_json
from .api import ApiError, LabAPI
from .connection import JSON_TYPE, MAX_HEAD_BUFFER, LabProtocol

STATIC_DIR = Path(__file__).resolve().parent / "static"
MAX_BODY = 1 << 20                   # bytes of one request body (1 MiB)
MAX_PATH = 8192                      # bytes of the request target (path and query)
MAX_HEADER_BYTES = 16384             # bytes of all header names and values together
MAX_HEADERS = 64                     # header lines
WORKERS = 8                          # threads that run API work (the model itself runs one at a time)
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
KNOWN_METHODS = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"}
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": ("default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
                                "script-src 'self'; connect-src 'self'; frame-ancestors 'none'"),
    "Cache-Control": "no-store",
}
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
            if name.startswith(".") or path.suffix not in CONTENT_TYPES:
                continue
            if not stat.S_ISREG(os.lstat(path).st_mode):          # symlinks and specials are skipped
                continue
            table["/" + path.relative_to(root).as_posix()] = path
    if "/index.html" in table:
        table["/"] = table["/index.html"]
    return table


def is_loopback(host: str) -> bool:
    """Whether a bind address is this machine only."""
    return host in ("127.0.0.1", "localhost", "::1", "[::1]")


def json_response(status: int, payload: dict, extra: dict[str, str] | None = None) -> Response:
    body = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    return Response(body, status, headers={**SECURITY_HEADERS, **(extra or {})}, media_type=JSON_TYPE)


def error_response(status: int, message: str, field: str | None, extra: dict[str, str] | None = None) -> Response:
    return json_response(status, {"error": message, "field": field}, extra)


class WorkerPool:
    """A fixed number of daemon threads running blocking work for the event loop.

    Daemon threads, unlike a ThreadPoolExecutor's, do not hold the process after Ctrl-C while a long
    computation (/api/verify) is still running: the server stops within GRACE seconds regardless.
    """

    def __init__(self, size: int = WORKERS) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        for i in range(size):
            threading.Thread(target=self._work, name=f"glassformer-lab-worker-{i}", daemon=True).start()

    def _work(self) -> None:
        while True:
            loop, future, fn, args = self._jobs.get()
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


class LabApp:
    """The ASGI application: checks in the module docstring's order, then the API or a static file."""

    def __init__(self, api: LabAPI, static: dict[str, Path], allowed_hosts: set[str]) -> None:
        self.api, self.static, self.allowed_hosts = api, static, allowed_hosts
        self.pool = WorkerPool()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":                   # lifespan is off; websockets are not served
            return
        try:
            response = await self.respond(scope, receive)
        except Exception as error:  # a bug, not bad input: one line in the log and in the answer
            log.error("internal error on %s %s: %s: %s", scope["method"], scope["path"][:200],
                      type(error).__name__, error)
            response = error_response(500, f"internal error: {type(error).__name__}", None)
        await response(scope, receive, send)

    def _check_head(self, scope, headers: dict[str, str]) -> Response | None:
        method = scope["method"]
        if len(scope["raw_path"]) + len(scope["query_string"]) > MAX_PATH:
            return error_response(414, f"the request path is over {MAX_PATH} bytes", "path")
        if len(scope["headers"]) > MAX_HEADERS or sum(len(k) + len(v) for k, v in scope["headers"]) > MAX_HEADER_BYTES:
            return error_response(431, f"request headers over {MAX_HEADERS} lines or {MAX_HEADER_BYTES} bytes",
                                  "headers")
        if method not in KNOWN_METHODS:
            return error_response(501, f"method {method[:20]} is not implemented", "method")
        if headers.get("host", "").strip().lower() not in self.allowed_hosts:
            return error_response(403, "this server answers only to its own host name and port "
                                       "(127.0.0.1, localhost or [::1])", "host")
        return None

    async def respond(self, scope, receive) -> Response:
        headers: dict[str, str] = {}
        for key, value in scope["headers"]:
            headers.setdefault(key.decode("latin-1"), value.decode("latin-1"))
        refused = self._check_head(scope, headers)
        if refused is not None:
            return refused
        method, path = scope["method"], scope["path"]
        if not scope["raw_path"].startswith(b"/"):
            return error_response(404, "not found", "path")
        is_api = path.startswith("/api/") or path == "/api"
        if method not in ("GET", "HEAD", "POST"):
            allow = self.api.ROUTES[path][0] if path in self.api.ROUTES else "GET, HEAD, POST"
            return error_response(405, f"method {method} is not allowed", "method", {"Allow": allow})
        body = None
        if method == "POST":
            if not is_api:
                return error_response(404, "not found", "path")
            refused, body = await self._read_body(headers, receive)
            if refused is not None:
                return refused
        if is_api:
            api_method = "GET" if method == "HEAD" else method
            try:
                payload = await self.pool.run(self.api.handle, api_method, path, body)
            except ApiError as error:
                extra = {"Allow": self.api.ROUTES[path][0]} if error.status == 405 else None
                return json_response(error.status, error.payload(), extra)
            except UsageError as error:
                return error_response(error.status, str(error), error.field)
            return json_response(200, payload)
        target = self.static.get(path)
        if target is None:
            return error_response(404, "not found", "path")
        try:
            data = await self.pool.run(target.read_bytes)
        except OSError:
            return error_response(404, "not found", "path")
        return Response(data, 200, headers=SECURITY_HEADERS, media_type=CONTENT_TYPES[target.suffix])

    def _origin_ok(self, headers: dict[str, str]) -> bool:
        """A browser's cross-site POST carries a foreign Origin: refuse it (the page's own fetch is same-origin)."""
        origin = headers.get("origin")
        if origin is None:
            return True
        parts = urlsplit(origin)
        return parts.scheme == "http" and parts.netloc.lower() == headers.get("host", "").strip().lower()

    async def _read_body(self, headers: dict[str, str], receive) -> tuple[Response | None, object]:
        """The JSON body, or the error answer: every size and type check comes before reading it."""
        if not self._origin_ok(headers):
            return error_response(403, "cross-origin requests are not accepted", "origin"), None
        kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind != "application/json":
            return error_response(415, "send the body as Content-Type: application/json", "content-type"), None
        if "transfer-encoding" in headers:
            return error_response(411, "send the body with a Content-Length (chunked bodies are not accepted)",
                                  "body"), None
        length = headers.get("content-length", "0").strip()
        if not length.isdigit() or len(length) > 18:
            return error_response(400, f"Content-Length is not a number: {length[:40]!r}", "body"), None
        size = int(length)
        if size > MAX_BODY:
            return error_response(413, f"request body is {size} bytes; the limit is {MAX_BODY}", "body"), None
        try:
            raw = await asyncio.wait_for(_receive_body(receive, size), BODY_TIMEOUT)
        except asyncio.TimeoutError:
            return error_response(408, f"the request body did not arrive within {BODY_TIMEOUT:g} s", "body"), None
        except ClientGone:
            return error_response(400, "the connection closed before the body was complete", "body"), None
        if not raw.strip():
            return error_response(400, "request body is empty; send a JSON object", "body"), None
        try:
            return None, load_json(raw, "request body")
        except UsageError as error:
            return error_response(400, str(error), error.field or "body"), None


class ClientGone(Exception):
    """The client closed its connection (or the server dropped it) before its body was complete."""


async def _receive_body(receive, size: int) -> bytes:
    chunks, got = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        got += len(chunk)
        if got > size:                                 # h11 enforces Content-Length; this is belt and braces
            break
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


class LabServer:
    """A bound socket and the uvicorn server that will serve the lab on it."""

    def __init__(self, address: tuple[str, int], api: LabAPI, static_dir: str | Path = STATIC_DIR,
                 quiet: bool = True, *, expose: bool = False, allow_hosts: tuple[str, ...] = ()) -> None:
        host, port = address
        if not is_loopback(host) and not expose:
            raise UsageError(f"--host {host}: binding an address other than loopback needs --expose "
                             "(anyone who can reach it can run computations on this machine)")
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
        self.allowed_hosts = {f"{name.lower()}:{bound}" for name in names}
        self.app = LabApp(api, static_table(static_dir), self.allowed_hosts)
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
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop serving (from another thread) and wait until the server has finished."""
        self._uvicorn.should_exit = True
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
