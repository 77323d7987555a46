"""bench.transport's bare responder: the floor bench.service prints is a real round trip of the
frame's bytes (the whole body read, the asked-for reply written), on one keep-alive connection."""

from __future__ import annotations

from http.client import HTTPConnection

from bench.transport import REPLY_HEADER, floor_round_trips, floor_server


def test_the_floor_responder_reads_whole_bodies_and_answers_the_asked_size():
    proc, port = floor_server()
    try:
        conn = HTTPConnection("127.0.0.1", port, timeout=30)
        body = bytes(range(256)) * 8000  # 2 MB: many socket reads
        for reply in (0, 1, 124_668):
            ms = floor_round_trips(conn, body, reply, 2)  # asserts each reply's length
            assert len(ms) == 2 and all(m > 0 for m in ms)
        sock = conn.sock
        conn.request("POST", "/", body=b"x" * 10, headers={REPLY_HEADER: "3"})
        response = conn.getresponse()
        assert (response.status, response.read()) == (200, b"\0\0\0")
        assert conn.sock is sock  # one keep-alive connection throughout
    finally:
        proc.terminate()
        proc.wait(10)
