"""Limits on one connection at the HTTP edge, over real sockets to `python -m app serve` (uvicorn):
body / header / idle timeouts, Connection: close on early errors (unparsable requests, both
lengths, a 401 before a chunked body), no second answer after one, and the shutdown budget with
an upload still arriving. What the server holds at once (bodies, connections, decoders):
test_limits_capacity.py."""

from __future__ import annotations

import json
import signal
import socket
import time

import httpx

from tests.app.service_helpers import (
    LIMITS_KEY,
    Server,
    connect,
    connection_rejects,
    metric_value,
    no_500_answered,
    read_until_closed,
    status_and_body,
)
from tests.app.service_helpers import limits_server  # noqa: F401 - the srv fixture


def test_body_deadline_408_closes(srv):
    with connect(srv) as s:
        s.sendall(
            b"POST /v1/segment?format=kitti HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "
            + LIMITS_KEY.encode()
            + b"\r\nContent-Length: 1600\r\n\r\n"
            + b"\0" * 16
        )
        status, headers, body = status_and_body(read_until_closed(s))
    assert status == 408 and headers["connection"] == "close"
    assert json.loads(body)["error"] == "body_timeout"


def test_header_timeout_closes(srv):
    with connect(srv) as s:
        s.sendall(b"POST /v1/segment HTTP/1.1\r\nHost: t\r\n")  # headers never finish
        status, _, body = status_and_body(read_until_closed(s))
    assert status == 408 and json.loads(body)["error"] == "header_timeout"


def test_idle_keep_alive_closes(srv):
    """Between requests the idle timeout rules, not the header timeout, and the close says
    nothing: a 408 there (the header timer, re-armed after each response) was read by the
    client as the answer to its next request."""
    with connect(srv) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        start = time.monotonic()
        raw = read_until_closed(s)  # the response, then the close after the idle timeout
        idle = time.monotonic() - start
    assert raw.startswith(b"HTTP/1.1 200") and raw.count(b"HTTP/1.1") == 1, raw
    assert idle > 2.5  # the idle timeout (3 s), not the header timeout (2 s): seconds apart


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(srv):
    with connect(srv) as s:
        assert read_until_closed(s) == b""  # closed at the header timeout, no 408 to misread


def _read_one(sock: socket.socket) -> bytes:
    """One response with a Content-Length body, read exactly (the connection stays open)."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        raw += sock.recv(65536)
    head, _, body = raw.partition(b"\r\n\r\n")
    _, headers, _ = status_and_body(head + b"\r\n\r\n")
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_no_second_answer_after_an_answer_to_a_request_whose_body_was_not_read(srv):
    """A route that answers without reading the body (GET /healthz with one): the body's bytes
    after the answer are no new request, so no 408 comes for them (they drew one once), and
    garbage in place of a chunk draws no JSON 400 after the 200: the connection just closes."""
    with connect(srv) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nContent-Length: 1600\r\n\r\n")
        assert _read_one(s).startswith(b"HTTP/1.1 200")
        s.sendall(b"\0" * 1600)
        assert read_until_closed(s) == b""  # closed without a word
    with connect(srv) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        s.sendall(b"5\r\nhello\r\n")
        assert _read_one(s).startswith(b"HTTP/1.1 200")
        s.sendall(b"ZZZ\r\n")
        assert read_until_closed(s) == b""


def _logged(srv: Server, request_id: str) -> bool:
    end = time.monotonic() + 5
    while time.monotonic() < end:
        if request_id in srv.output():  # a new id (uuid4): only its own line has it
            return True
        time.sleep(0.05)
    return False


def test_unparsable_requests_get_a_json_400(srv):
    for bad in (b"Content-Length: +16", b"Content-Length: 1\r\nContent-Length: 2", b"Bad Name: 1"):
        with connect(srv) as s:
            s.sendall(b"POST /v1/segment HTTP/1.1\r\nHost: t\r\n" + bad + b"\r\n\r\n")
            status, headers, body = status_and_body(read_until_closed(s))
        assert status == 400 and headers["content-type"] == "application/json", body
        assert json.loads(body)["error"] == "bad_request" and json.loads(body)["detail"]
        # as every answer: a Server-Timing total, and the request id in the access log
        assert float(headers["server-timing"].split("dur=")[1]) >= 0
        assert _logged(srv, headers["x-request-id"]), srv.output()[-2000:]
    assert httpx.get(f"{srv.url}/healthz").status_code == 200
    # answered before any route: counted all the same
    assert connection_rejects(srv, "bad_request") >= 3


def test_a_request_with_both_lengths_is_refused(srv):
    """Content-Length and Transfer-Encoding together: h11 reads the chunks, while the body's
    memory hold and the inline-decode choice went by the (small) length. 400, and closed."""
    head = b"POST /v1/segment HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " + LIMITS_KEY.encode()
    for length in (b"4", b"0"):  # 0: no body by the length, closed all the same
        with connect(srv) as s:
            s.sendall(head + b"\r\nContent-Length: " + length + b"\r\nTransfer-Encoding: chunked")
            s.sendall(b"\r\n\r\n10\r\n" + b"\0" * 16 + b"\r\n0\r\n\r\n")
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")  # never answered
            status, headers, body = status_and_body(read_until_closed(s))
        assert status == 400 and headers["connection"] == "close", body
        assert json.loads(body)["error"] == "ambiguous_framing" and "x-request-id" in headers
    text = httpx.get(f"{srv.url}/metrics").text
    labels = 'code="ambiguous_framing",route="/v1/segment"'  # the segment error ratios see it
    assert metric_value(text, "lidarseg_errors_total", labels)


def test_401_closes_without_reading_a_chunked_body(srv):
    with connect(srv) as s:
        s.sendall(b"POST /v1/segment HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        sent, closed = 0, False
        try:
            for _ in range(4096):  # up to 256 MiB: the server must hang up long before
                s.sendall(b"10000\r\n" + b"\0" * 65536 + b"\r\n")
                sent += 65536
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        raw = b"" if closed else read_until_closed(s)
    if raw:
        status, headers, _ = status_and_body(raw)
        assert status == 401 and headers["connection"] == "close"
    assert sent < 256 * 1024 * 1024


def test_sigterm_answers_an_arriving_upload_and_exits_within_budget():
    srv = Server(shutdown_budget_s=8, log_level="info")
    try:
        with connect(srv) as s:
            s.sendall(
                b"POST /v1/segment?format=kitti HTTP/1.1\r\nHost: t\r\n"
                b"Content-Length: 1600000\r\n\r\n" + b"\0" * 1600
            )
            time.sleep(0.5)
            srv.proc.send_signal(signal.SIGTERM)
            status, headers, body = status_and_body(read_until_closed(s))
        assert status == 503 and json.loads(body)["error"] == "draining"
        assert headers["connection"] == "close"
        assert srv.proc.wait(8 + 15) == 0
        log = srv.output()
        assert "Traceback" not in log and '"status":500' not in log, log
    finally:
        srv.stop()


def test_metrics_count_no_500(srv):
    assert no_500_answered(srv)  # no route answered a 500
