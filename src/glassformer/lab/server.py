"""The lab's local HTTP server: the packaged static page plus the JSON API, standard library only.

Hardening: only the regular files found in the static folder at start-up are ever served (a fixed
table, so `..`, encoded dots, absolute paths and symlinks simply are not in it); request bodies
over 1 MB get 413; bad JSON or input 400 with {"error", "field"}; unknown paths 404; a server
bound to loopback answers only requests whose Host is a loopback name (DNS rebinding); a POST
must be application/json from the page's own origin (no cross-site form or fetch can drive it).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from .api import ApiError, LabAPI

STATIC_DIR = Path(__file__).resolve().parent / "static"
MAX_BODY = 1 << 20                                   # 1 MiB
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
JSON_TYPE = "application/json; charset=utf-8"
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1", "[::1]"}
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": ("default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
                                "script-src 'self'; connect-src 'self'; frame-ancestors 'none'"),
}


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


class LabServer(ThreadingHTTPServer):
    """ThreadingHTTPServer holding the API object and the static allow-list."""

    daemon_threads = False          # server_close() waits for requests in flight (each is short)
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], api: LabAPI, static_dir: str | Path = STATIC_DIR,
                 quiet: bool = True) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.api = api
        self.static = static_table(static_dir)
        self.quiet = quiet
        super().__init__(address, LabHandler)

    def handle_error(self, request, client_address) -> None:
        """A browser that closed its connection early is not an error worth a traceback."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/"

    @property
    def loopback(self) -> bool:
        return self.server_address[0] in LOOPBACK_NAMES or self.server_address[0].startswith("127.")


class LabHandler(BaseHTTPRequestHandler):
    """GET static files and GET/POST the JSON API; everything else is 404 or 405."""

    server: LabServer
    timeout = 30                    # seconds a client may stall mid-request before its socket is closed
    server_version = "glassformer-lab"
    sys_version = ""

    # -- plumbing
    def log_message(self, format: str, *args) -> None:  # noqa: A002 (BaseHTTPRequestHandler's name)
        if not self.server.quiet:
            sys.stderr.write("%s - %s\n" % (self.address_string(), format % args))

    def _send(self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in {**SECURITY_HEADERS, **(extra or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: dict, extra: dict[str, str] | None = None) -> None:
        body = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
        self._send(status, body, JSON_TYPE, extra)

    def _error(self, status: int, message: str, field: str | None = None,
               extra: dict[str, str] | None = None) -> None:
        self._json(status, {"error": message, "field": field}, extra)

    def _host_ok(self) -> bool:
        """On a loopback server, refuse requests addressed to another host name (DNS rebinding)."""
        if not self.server.loopback:
            return True
        host = (self.headers.get("Host") or "").strip().lower()
        if host.startswith("["):
            name = host.split("]", 1)[0] + "]"
        else:
            name = host.rsplit(":", 1)[0] if ":" in host else host
        return name in LOOPBACK_NAMES or name.startswith("127.")

    # -- verbs
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._dispatch(body=None)

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch(body=None)

    def _origin_ok(self) -> bool:
        """A browser's cross-site POST carries a foreign Origin: refuse it (the page's own fetch is same-origin)."""
        origin = self.headers.get("Origin")
        if origin is None or origin == "null":
            return origin is None
        return urlsplit(origin).netloc.lower() == (self.headers.get("Host") or "").strip().lower()

    def do_POST(self) -> None:  # noqa: N802
        if not self._origin_ok():
            self.close_connection = True
            return self._error(403, "cross-origin requests are not accepted", "origin")
        kind = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if kind != "application/json":
            self.close_connection = True
            return self._error(415, "send the body as Content-Type: application/json", "content-type")
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            return self._error(411, "send the body with a Content-Length (chunked bodies are not accepted)",
                               "body")
        try:
            size = int(length) if length is not None else 0
        except ValueError:
            self.close_connection = True
            return self._error(400, f"Content-Length is not a number: {length!r}", "body")
        if size < 0:
            self.close_connection = True
            return self._error(400, "Content-Length is negative", "body")
        if size > MAX_BODY:
            self.close_connection = True                     # the body is left unread: drop the connection
            return self._error(413, f"request body is {size} bytes; the limit is {MAX_BODY}", "body")
        raw = self.rfile.read(size) if size else b""
        try:
            body = json.loads(raw.decode("utf-8")) if raw.strip() else None
        except UnicodeDecodeError:
            return self._error(400, "request body is not UTF-8", "body")
        except json.JSONDecodeError as error:
            return self._error(400, f"invalid JSON at line {error.lineno} column {error.colno}: {error.msg}",
                               "body")
        if body is None:
            return self._error(400, "request body is empty; send a JSON object", "body")
        self._dispatch(body=body)

    def _other(self) -> None:
        self._error(405, f"method {self.command} is not allowed", "method", {"Allow": "GET, HEAD, POST"})

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _other  # noqa: N815

    def _dispatch(self, body) -> None:
        if not self._host_ok():
            return self._error(403, "this server answers only to a loopback host name", "host")
        raw_path = self.path
        path = urlsplit(raw_path).path if raw_path.startswith("/") else None
        if path is None:
            return self._error(404, "not found", "path")
        if path.startswith("/api/") or path == "/api":
            method = "GET" if self.command == "HEAD" else self.command
            try:
                payload = self.server.api.handle(method, path, body)
            except ApiError as error:
                extra = {"Allow": self.server.api.ROUTES[path][0]} if error.status == 405 else None
                return self._json(error.status, error.payload(), extra)
            except Exception as error:  # a bug, not bad input: say so in one line, keep serving
                return self._error(500, f"internal error: {type(error).__name__}: {error}", None)
            return self._json(200, payload)
        if self.command == "POST":
            return self._error(404, "not found", "path")
        target = self.server.static.get(path)
        if target is None:
            return self._error(404, "not found", "path")
        try:
            data = target.read_bytes()
        except OSError:
            return self._error(404, "not found", "path")
        self._send(200, data, CONTENT_TYPES[target.suffix])


def make_server(api: LabAPI | None = None, host: str = "127.0.0.1", port: int = 8765, *,
                static_dir: str | Path = STATIC_DIR, quiet: bool = True) -> LabServer:
    """A bound, not yet serving, lab server (port 0 = an ephemeral port; see `.url`)."""
    return LabServer((host, port), api if api is not None else LabAPI(), static_dir, quiet)


def serve_in_thread(server: LabServer) -> threading.Thread:
    """Serve in a background thread (tests, notebooks); stop with server.shutdown(); server.server_close()."""
    thread = threading.Thread(target=server.serve_forever, name="glassformer-lab", daemon=True)
    thread.start()
    return thread
