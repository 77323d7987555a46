"""What the server holds at once, over real sockets to `python -m app serve` (uvicorn): the bodies
held at once (LIDARSEG_MAX_BODIES_BYTES), the connection cap, and the probes that keep answering
while a decode flood keeps every decoder busy. The limits on one connection: test_limits.py."""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import numpy as np

from app.codecs.encode import encode
from tests.app.service_helpers import (
    LIMITS_KEY,
    Server,
    connect,
    connection_rejects,
    read_until_closed,
    status_and_body,
)
from tests.app.service_helpers import limits_server  # noqa: F401 - the srv fixture


def _declare(s: socket.socket, size: int, sent: bytes = b"") -> None:
    s.sendall(
        b"POST /v1/segment?format=xyz HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "
        + LIMITS_KEY.encode()
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
        status, headers, body = status_and_body(refused)
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
            status, headers, body = status_and_body(read_until_closed(s))
        assert status == 503 and headers["retry-after"]
        assert json.loads(body)["error"] == "too_many_connections"
        assert len(headers["x-request-id"]) == 32  # answered before any route: an id all the same
    finally:
        for s in idle:
            s.close()
    assert connection_rejects(srv, "too_many_connections") >= 1
    time.sleep(0.3)
    assert httpx.get(f"{srv.url}/healthz").status_code == 200


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
        [sys.executable, "-c", _FLOOD, srv.url, str(tmp_path / "heavy.ply"), LIMITS_KEY, "4"],
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
