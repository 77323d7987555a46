"""Limits at the HTTP edge, over real sockets to `python -m app serve` (uvicorn): probes during a
decode flood, body / header / idle timeouts, the connection cap, Connection: close on early
errors, and the shutdown budget with an upload still arriving."""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from app.codecs.encode import encode
from tests.app.service_helpers import Server, connect, metric_value, read_until_closed

KEY = "limits-key-0123456789"


def _status_and_body(raw: bytes) -> tuple[int, dict, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


@pytest.fixture(scope="module")
def srv():
    s = Server(
        body_timeout_s=2,
        header_timeout_s=2,
        idle_timeout_s=3,  # longer than the header timeout: it must still rule between requests
        max_connections=6,
        decode_concurrency=2,
        max_bodies_bytes=100 * 1024 * 1024,
        api_keys=KEY,
    )
    yield s
    assert s.stop() == 0, s.output()


def test_body_deadline_408_closes(srv):
    with connect(srv) as s:
        s.sendall(
            b"POST /v1/segment?format=kitti HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "
            + KEY.encode()
            + b"\r\nContent-Length: 1600\r\n\r\n"
            + b"\0" * 16
        )
        status, headers, body = _status_and_body(read_until_closed(s))
    assert status == 408 and headers["connection"] == "close"
    assert json.loads(body)["error"] == "body_timeout"


def test_header_timeout_closes(srv):
    with connect(srv) as s:
        s.sendall(b"POST /v1/segment HTTP/1.1\r\nHost: t\r\n")  # headers never finish
        status, _, body = _status_and_body(read_until_closed(s))
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
    _, headers, _ = _status_and_body(head + b"\r\n\r\n")
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
            status, headers, body = _status_and_body(read_until_closed(s))
        assert status == 400 and headers["content-type"] == "application/json", body
        assert json.loads(body)["error"] == "bad_request" and json.loads(body)["detail"]
        # as every answer: a Server-Timing total, and the request id in the access log
        assert float(headers["server-timing"].split("dur=")[1]) >= 0
        assert _logged(srv, headers["x-request-id"]), srv.output()[-2000:]
    assert httpx.get(f"{srv.url}/healthz").status_code == 200
    assert _rejects(srv, "bad_request") >= 3  # answered before any route: counted all the same


def test_a_request_with_both_lengths_is_refused(srv):
    """Content-Length and Transfer-Encoding together: h11 reads the chunks, while the body's
    memory hold and the inline-decode choice went by the (small) length. 400, and closed."""
    head = b"POST /v1/segment HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " + KEY.encode()
    for length in (b"4", b"0"):  # 0: no body by the length, closed all the same
        with connect(srv) as s:
            s.sendall(head + b"\r\nContent-Length: " + length + b"\r\nTransfer-Encoding: chunked")
            s.sendall(b"\r\n\r\n10\r\n" + b"\0" * 16 + b"\r\n0\r\n\r\n")
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")  # never answered
            status, headers, body = _status_and_body(read_until_closed(s))
        assert status == 400 and headers["connection"] == "close", body
        assert json.loads(body)["error"] == "ambiguous_framing" and "x-request-id" in headers
    text = httpx.get(f"{srv.url}/metrics").text
    labels = 'code="ambiguous_framing",route="/v1/segment"'  # the segment error ratios see it
    assert metric_value(text, "lidarseg_errors_total", labels)


def _declare(s: socket.socket, size: int, sent: bytes = b"") -> None:
    s.sendall(
        b"POST /v1/segment?format=xyz HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "
        + KEY.encode()
        + f"\r\nContent-Length: {size}\r\n\r\n".encode()
        + sent
    )


def _answer_at_once(srv: Server, size: int) -> bytes | None:
    """What the server answers within 0.5 s to a request declaring a `size`-byte body (and then
    to its close), or None when it waits for the body (admitted)."""
    with connect(srv) as s:
        _declare(s, size)
        s.settimeout(0.5)
        try:
            first = s.recv(65536)
        except TimeoutError:
            return None
        s.settimeout(30)
        return first + read_until_closed(s)


def test_bodies_held_at_once_are_bounded(srv):
    """LIDARSEG_MAX_BODIES_BYTES (100 MiB here): a second 60 MiB body while the first is still
    arriving gets a JSON 503 at once; the first one's bytes are given back when it ends (here
    its client leaves), and the same body is taken again. Before, 24 connections sending 60 MB
    bodies each took the server from 618 MB to 2 GB."""
    big = 60 * 1024 * 1024
    with connect(srv) as first:
        _declare(first, big, b"\0" * 65536)
        for _ in range(50):  # until the first one's route holds its declared bytes
            refused = _answer_at_once(srv, big)
            if refused is not None:
                break
        else:
            raise AssertionError("a second 60 MiB body was never refused")
        status, headers, body = _status_and_body(refused)
        assert status == 503 and headers["connection"] == "close" and headers["retry-after"]
        assert json.loads(body)["error"] == "bodies_busy"
    for _ in range(50):  # the first route sees its client gone (499) and gives the bytes back
        answer = _answer_at_once(srv, big)
        if answer is None:
            break  # waiting for the body: admitted
        assert b"bodies_busy" in answer, answer
        time.sleep(0.2)
    else:
        raise AssertionError("the first body's bytes were never given back")


def test_connection_cap(srv):
    idle = [connect(srv) for _ in range(6)]
    try:
        time.sleep(0.3)
        with connect(srv) as s:
            status, headers, body = _status_and_body(read_until_closed(s))
        assert status == 503 and headers["retry-after"]
        assert json.loads(body)["error"] == "too_many_connections"
        assert len(headers["x-request-id"]) == 32  # answered before any route: an id all the same
    finally:
        for s in idle:
            s.close()
    assert _rejects(srv, "too_many_connections") >= 1
    time.sleep(0.3)
    assert httpx.get(f"{srv.url}/healthz").status_code == 200


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
        status, headers, _ = _status_and_body(raw)
        assert status == 401 and headers["connection"] == "close"
    assert sent < 256 * 1024 * 1024


_FLOOD = r"""
import sys, threading, httpx
body = open(sys.argv[2], "rb").read()
headers = {"Authorization": "Bearer " + sys.argv[3], "Content-Type": "application/x-ply",
           "Accept": "application/octet-stream"}
def post():
    with httpx.Client(base_url=sys.argv[1], timeout=120) as c:
        while True:
            code = c.post("/v1/segment", content=body, headers=headers).status_code
            sys.stdout.write(f"{code}\n"); sys.stdout.flush()  # one write per line
for _ in range(int(sys.argv[4])):
    threading.Thread(target=post, daemon=True).start()
sys.stdin.read()
"""


def test_probes_answer_during_a_decode_flood(srv, tmp_path):
    """Bodies that are slow to decode (large ascii PLY) keep every decoder busy (the rest get
    503); /healthz keeps answering within the kubelet's 1 s probe timeout (issue 15: 5.3 s).
    The frames decode fully but hold no finite point (422), so the flood measures the decoders,
    not inference. The flood runs in its own process, so the probe's own client is not slowed by
    it."""
    heavy, _ = encode(np.full((200_000, 4), np.nan, np.float32), "ply_ascii")
    (tmp_path / "heavy.ply").write_bytes(heavy)
    flood = subprocess.Popen(
        [sys.executable, "-c", _FLOOD, srv.url, str(tmp_path / "heavy.ply"), KEY, "4"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.nice(10),
    )  # the load, not the probe's rival
    worst = 0.0
    try:
        gc.collect()
        gc.freeze()  # this client's own GC pauses (the test process is large) are not the server's
        with httpx.Client(base_url=srv.url, timeout=30) as probe:
            time.sleep(2.0)
            for _ in range(40):
                t0 = time.perf_counter()
                assert probe.get("/healthz").status_code == 200
                worst = max(worst, time.perf_counter() - t0)
                time.sleep(0.05)
    finally:
        gc.unfreeze()
        flood.kill()
        statuses = [int(line) for line in flood.communicate()[0].split()]
    assert 503 in statuses and set(statuses) <= {422, 503}, statuses  # decoders saturated
    # The target is 100 ms: measured worst 16-82 ms over five runs at load 5 (README,
    # Limits). No timing threshold that tight in a test on a shared machine: the bound asserted
    # is the kubelet's default probe timeout (1 s; before: 5.3 s, a restarted pod).
    assert worst < 1.0, f"/healthz took {worst * 1e3:.0f} ms during the flood"


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
            status, headers, body = _status_and_body(read_until_closed(s))
        assert status == 503 and json.loads(body)["error"] == "draining"
        assert headers["connection"] == "close"
        assert srv.proc.wait(8 + 15) == 0
        log = srv.output()
        assert "Traceback" not in log and '"status":500' not in log, log
    finally:
        srv.stop()


def _rejects(srv: Server, reason: str) -> float:
    text = httpx.get(f"{srv.url}/metrics").text
    return metric_value(text, "lidarseg_connection_rejects_total", f'reason="{reason}"')


def test_metrics_count_no_500(srv):
    text = httpx.get(f"{srv.url}/metrics").text
    assert 'status="500"' not in text  # no route answered a 500
