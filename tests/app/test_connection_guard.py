"""The connection guard at its exact bounds, over real sockets to `python -m app serve`: the cap
admits exactly LIDARSEG_MAX_CONNECTIONS, and the header timeout counts from a request's first
byte. (From a hand-made mutation audit, 2026-12-06.)"""

from __future__ import annotations

import json
import time

import pytest

from tests.app.service_helpers import Server, connect, read_until_closed


@pytest.fixture(scope="module")
def srv():
    s = Server(header_timeout_s=3, idle_timeout_s=5, max_connections=3)
    yield s
    assert s.stop() == 0, s.output()


def _status(raw: bytes) -> tuple[int, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def test_the_connection_cap_admits_exactly_max_connections(srv):
    """guard.py: LIDARSEG_MAX_CONNECTIONS connections are served (`>`, not `>=`); the next one
    gets the 503 (test_limits_capacity.py checks only the one beyond)."""
    idle = [connect(srv) for _ in range(2)]
    try:
        time.sleep(0.3)  # the server has accepted them
        with connect(srv) as third:  # the 3rd of 3: served
            third.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            status, _ = _status(read_until_closed(third))
            assert status == 200
        idle.append(connect(srv))
        time.sleep(0.3)
        with connect(srv) as fourth:  # the 4th while 3 are open: refused
            status, body = _status(read_until_closed(fourth))
            assert status == 503 and json.loads(body)["error"] == "too_many_connections"
    finally:
        for s in idle:
            s.close()


def test_the_header_timeout_counts_from_the_first_byte(srv):
    """guard.py: a request's line and headers get LIDARSEG_HEADER_TIMEOUT_S (3 s) from their
    first byte, not from the connection's start: a client that connects, waits 2 s (a pooled
    connection; a new one silent for 3 s is closed), then sends its headers over 1.5 s is
    answered (1.5 s to spare; counted from the connection it would be cut at 3 s, before the
    last header at 3.5 s); headers never finished are still a 408."""
    time.sleep(0.5)  # the previous test's connections are gone
    with connect(srv) as s:
        time.sleep(2.0)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
        time.sleep(1.5)  # 3.5 s after the connection, 1.5 s after the first byte
        s.sendall(b"Connection: close\r\n\r\n")
        status, body = _status(read_until_closed(s))
    assert status == 200, body
    with connect(srv) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")  # never finished
        status, body = _status(read_until_closed(s))
    assert status == 408 and json.loads(body)["error"] == "header_timeout"
