"""The checks a lab request meets before its route, and the JSON answer every error gets.

`HeadLimits`: a request head over the size limits (414, 431) or with an unknown method (501).
`OwnHostOnly`: the Host header must be one of the server's names with its port (403): DNS rebinding.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from starlette.datastructures import Headers
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import Response

from .connection import JSON_TYPE

MAX_PATH = 8192                      # bytes of the request target (path and query)
MAX_HEADER_BYTES = 16384             # bytes of all header names and values together
MAX_HEADERS = 64                     # header lines
KNOWN_METHODS = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"}
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": ("default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
                                "script-src 'self'; connect-src 'self'; frame-ancestors 'none'"),
    "Cache-Control": "no-store",
}


def json_bytes(payload: dict) -> bytes:
    """An answer's body: compact UTF-8 JSON, no NaN."""
    return json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


def json_response(status: int, payload: dict, extra: Mapping[str, str] | None = None) -> Response:
    return Response(json_bytes(payload), status, headers={**SECURITY_HEADERS, **(extra or {})}, media_type=JSON_TYPE)


def error_response(status: int, message: str, field: str | None, extra: Mapping[str, str] | None = None) -> Response:
    return json_response(status, {"error": message, "field": field}, extra)


# ---- before routing: the request head and the Host header -------------------------------------
class HeadLimits:
    """ASGI middleware: a request head over the size limits (414, 431) or with an unknown method (501)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        refused = _head_refusal(scope) if scope["type"] == "http" else None
        if refused is not None:
            await refused(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def _head_refusal(scope) -> Response | None:
    method = scope["method"]
    if len(scope["raw_path"]) + len(scope["query_string"]) > MAX_PATH:
        return error_response(414, f"the request path is over {MAX_PATH} bytes", "path")
    if len(scope["headers"]) > MAX_HEADERS or sum(len(k) + len(v) for k, v in scope["headers"]) > MAX_HEADER_BYTES:
        return error_response(431, f"request headers over {MAX_HEADERS} lines or {MAX_HEADER_BYTES} bytes",
                              "headers")
    if method not in KNOWN_METHODS:
        return error_response(501, f"method {method[:20]} is not implemented", "method")
    return None


_NAME_ACCEPTED = "glassformer.host_name_accepted"      # scope key: TrustedHostMiddleware let the name through


async def _accept_name(scope, receive, send) -> None:
    scope[_NAME_ACCEPTED] = True


async def _discard(message) -> None:
    """TrustedHostMiddleware's own refusal (plain-text 400) is not sent: OwnHostOnly answers instead."""


class OwnHostOnly:
    """ASGI middleware: the Host header must be one of `names` with the server's `port`, else 403 JSON.

    Starlette's TrustedHostMiddleware judges the name (it parses the header, brackets of [::1] included);
    it compares names only and refuses in plain text, so here it only gives its verdict, the port is
    checked beside it, and every refusal is the lab's JSON answer.
    """

    def __init__(self, app, names: set[str], port: int) -> None:
        self.app, self.port = app, f":{port}"
        self.judge = TrustedHostMiddleware(_accept_name, allowed_hosts=sorted(names), www_redirect=False)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        await self.judge(scope, receive, _discard)
        accepted = scope.pop(_NAME_ACCEPTED, False) and Headers(scope=scope).get("host", "").endswith(self.port)
        if accepted:
            await self.app(scope, receive, send)
        else:
            await error_response(403, "this server answers only to its own host name and port "
                                      "(127.0.0.1, localhost or [::1])", "host")(scope, receive, send)
