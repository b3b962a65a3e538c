"""One HTTP connection of the lab: uvicorn's h11 protocol with a connection cap, a deadline for the
request head (a client trickling header lines gets 408 and is cut off), a deadline for a client that
stops reading its answer (cut off: its connection no longer counts against the cap) and JSON answers
for the errors it sends itself (a malformed request, too many connections, a late head)."""

from __future__ import annotations

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

JSON_TYPE = "application/json; charset=utf-8"
MAX_HEAD_BUFFER = 128 << 10          # bytes the parser buffers for an unfinished head (more: 400)
MAX_CONNECTIONS = 64                 # open connections at once (more: 503)
HEAD_TIMEOUT = 10.0                  # seconds for a whole request head to arrive
WRITE_TIMEOUT = 10.0                 # seconds an answer may wait, unread, for its client to read on


def _write_raw_error(transport, status: int, reason: str, message: str, field: str | None) -> None:
    """An error answer written straight to a connection the app never saw, then closed."""
    body = json.dumps({"error": message, "field": field}, ensure_ascii=False).encode("utf-8")
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {JSON_TYPE}\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    transport.write(head.encode("ascii") + body)
    transport.close()



class LabProtocol(H11Protocol):
    """uvicorn's h11 protocol with a connection cap, a deadline for the request head and JSON errors."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_timer = self._write_timer = None
        if len(self.connections) > MAX_CONNECTIONS:
            _write_raw_error(transport, 503, "Service Unavailable",
                             f"too many connections (limit {MAX_CONNECTIONS}); try again", "connection")
            return
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(_head_timeout_s(), self._head_timeout)

    def _cancel_head_timer(self) -> None:
        self._head_timer = _cancelled(getattr(self, "_head_timer", None))

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return
        if self.conn.trailing_data[0]:                 # part of a head came: answer it, then cut it off
            _write_raw_error(self.transport, 408, "Request Timeout",
                             f"the request head did not arrive within {_head_timeout_s():g} s", "request")
        else:                                          # nothing (an idle keep-alive connection): close it
            self.transport.close()

    def pause_writing(self) -> None:
        """The client's socket is full: it gets WRITE_TIMEOUT seconds to read on before the connection is cut."""
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(_write_timeout_s(), self._write_timeout)

    def resume_writing(self) -> None:
        self._cancel_write_timer()
        super().resume_writing()

    def _cancel_write_timer(self) -> None:
        self._write_timer = _cancelled(getattr(self, "_write_timer", None))

    def _write_timeout(self) -> None:
        self._write_timer = None
        if not self.transport.is_closing():
            self.transport.abort()                     # an answer half sent: nothing else can be said

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not before:                   # a whole request head arrived
            self._cancel_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_timer()

    def connection_lost(self, exc) -> None:
        self._cancel_head_timer()
        self._cancel_write_timer()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """Ctrl-C: a request still waiting for its client's body is dropped at once; a computation gets GRACE."""
        if self.cycle is not None and not self.cycle.response_complete and self.cycle.more_body:
            self.transport.close()
            return
        super().shutdown()

    def send_400_response(self, msg: str) -> None:
        _write_raw_error(self.transport, 400, "Bad Request",
                         f"malformed HTTP request (or a request head over {MAX_HEAD_BUFFER // 1024} KiB)", "request")


def _head_timeout_s() -> float:
    return HEAD_TIMEOUT


def _write_timeout_s() -> float:
    return WRITE_TIMEOUT


def _cancelled(timer) -> None:
    """Cancel a pending timer (None: nothing pending); None, for the attribute that held it."""
    if timer is not None:
        timer.cancel()
