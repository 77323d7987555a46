"""The connection guard: uvicorn's h11 protocol, hardened.

GuardedH11 is uvicorn's h11 protocol plus
  - a header timeout: a request's line and headers must be in within LIDARSEG_HEADER_TIMEOUT_S
    of its first byte, else 408 and closed (slow-header clients cannot hold connections). A new
    connection that sends nothing for as long, or the unread rest of a body after its answer,
    is closed without a word: a 408 there would be read as the answer to the request a client
    sends next. Between requests uvicorn's keep-alive timeout runs (LIDARSEG_IDLE_TIMEOUT_S,
    whole seconds);
  - a JSON body on uvicorn's 400 for a request h11 cannot parse (a bad Content-Length,
    Transfer-Encoding or request line), like every other error of the service;
  - a connection cap: beyond LIDARSEG_MAX_CONNECTIONS open connections a new one gets a JSON 503
    with Retry-After and is closed;
  - read-ahead (app/service/read_ahead.py): a small declared body streams in while the route
    starts, past h11's buffers.
The body deadline (408) and the rest live in the routes (routes/body.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Callable, NamedTuple, TypedDict

import h11
import uvicorn

from app.service.read_ahead import ReadAheadH11


class Rejected(NamedTuple):
    """A connection answered before any route: counted (lidarseg_connection_rejects) and
    access-logged by the server's on_reject."""

    code: str  # the error code, the counter's reason
    status: int
    request_id: str
    total_ms: float  # from the request's first byte (or the connection's start) to the answer
    client: str | None


def _raw_response(status: str, body: dict, rejected: Rejected, extra: str = "") -> bytes:
    """A JSON answer written before any route (with a request id and a Server-Timing total, as
    every answer has), then the connection closes."""
    payload = json.dumps(body).encode()
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"x-request-id: {rejected.request_id}\r\n"
        f"server-timing: total;dur={rejected.total_ms:.3f}\r\n"
        f"content-length: {len(payload)}\r\n{extra}\r\n"
    ).encode() + payload


class Guard(TypedDict):
    max_connections: int
    read_ahead_bytes: int
    header_timeout_s: float
    retry_after_s: int
    on_reject: Callable[[Rejected], object]


class GuardedConfig(uvicorn.Config):
    """uvicorn's Config carrying GuardedH11's limits (set by uvicorn_config)."""

    lidarseg_guard: Guard


class GuardedH11(ReadAheadH11):
    """uvicorn's h11 protocol with a header timeout, a connection cap and read-ahead (see the
    module doc)."""

    config: GuardedConfig  # uvicorn_config's: the protocol gets the server's config
    _header_timer: asyncio.TimerHandle | None
    _request_bytes = False  # a byte of the next request has come (else a timeout says nothing)
    _request_start = 0.0  # time.perf_counter() at that byte (or the connection's start)

    def connection_made(self, transport) -> None:
        self._request_start = time.perf_counter()
        guard = self.config.lidarseg_guard
        self.read_ahead_bytes = guard["read_ahead_bytes"]
        super().connection_made(transport)
        if len(self.connections) > guard["max_connections"]:
            self._refuse(
                "503 Service Unavailable",
                "too_many_connections",
                f"more than {guard['max_connections']} open connections",
                f"retry-after: {guard['retry_after_s']}\r\n",
            )
            transport.close()
            self.connections.discard(self)
            return
        self._arm_header_timer()

    def _refuse(self, status: str, code: str, detail: str, extra: str = "") -> None:
        """Writes a JSON answer given before any route, counted and logged (on_reject); the
        caller closes the connection."""
        peer = self.transport.get_extra_info("peername")
        rejected = Rejected(
            code,
            int(status.split()[0]),
            uuid.uuid4().hex,
            (time.perf_counter() - self._request_start) * 1e3,
            f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else None,
        )
        body = {"error": code, "detail": detail}
        self.transport.write(_raw_response(status, body, rejected, extra))
        try:  # counted and logged after the answer is out; nothing may escape into uvicorn
            self.config.lidarseg_guard["on_reject"](rejected)
        except Exception:  # noqa: BLE001 - a metric or log failure must not cost the answer
            logging.getLogger("lidarseg").exception("counting a refused connection")

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_header_timer(self) -> None:
        self._waiting_cycle = self.cycle
        self._header_timer = self.loop.call_later(
            self.config.lidarseg_guard["header_timeout_s"], self._header_timeout
        )

    def data_received(self, data: bytes) -> None:
        if self._between_requests():
            # After the answer: the rest of the last request's body (a route that answered
            # without reading it; its timer closes silently), or a new request's first bytes
            # (their_state IDLE), whose headers get the whole timeout from here.
            if self.conn.their_state is h11.IDLE and not self._request_bytes:
                self._request_bytes = True
                self._request_start = time.perf_counter()
                self._disarm_header_timer()
            if getattr(self, "_header_timer", None) is None:
                self._arm_header_timer()
        super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot parse, as JSON, and the connection closed;
        only the close where an answer has gone out already (a second one would be read as the
        next request's)."""
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            self._refuse("400 Bad Request", "bad_request", msg)
        self.transport.close()

    def _disarm_header_timer(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.cycle is self._waiting_cycle and not self.transport.is_closing():
            if self._request_bytes:  # else nothing was asked: no answer to misread
                self._refuse(
                    "408 Request Timeout",
                    "header_timeout",
                    "request headers did not arrive in time",
                )
            self.transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not getattr(self, "_waiting_cycle", self.cycle):
            self._disarm_header_timer()  # a request's headers arrived

    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms uvicorn's keep-alive timeout
        if not self.transport.is_closing() and self._between_requests():
            self._disarm_header_timer()
            # part of a pipelined request (h11 has started the next cycle: their_state IDLE)
            pipelined = self.conn.their_state is h11.IDLE and bool(self.conn.trailing_data[0])
            self._request_bytes = pipelined
            if pipelined:
                self._request_start = time.perf_counter()
                self._arm_header_timer()

    def connection_lost(self, exc) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)
