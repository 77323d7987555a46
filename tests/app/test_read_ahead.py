"""GuardedH11's read-ahead (app/service/read_ahead.py): a body that declares a Content-Length up
to the bound streams in without uvicorn pausing the socket and reaches the route whole, past h11;
a larger one, a chunked one and a pipelined request behind a finished one still pause. The
protocol is driven with bytes over a recording transport, an ASGI app that never reads the body
standing for a route not yet started, and one that echoes what it got for the route that reads.
"""

from __future__ import annotations

import asyncio

import pytest
from uvicorn.server import ServerState

from app.service.config import Settings
from app.service.read_ahead import READ_AHEAD_BYTES, ReadAheadH11, declared_length
from app.service.guard import GuardedH11
from app.service.server import uvicorn_config


class RecordingTransport(asyncio.Transport):
    """Counts pause_reading calls; has asyncio's socket read size (max_size), as its selector
    transports do."""

    max_size = 256 * 1024

    def __init__(self) -> None:
        super().__init__()
        self.pauses = 0
        self.written = b""

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        self.pauses += 1

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def write(self, data) -> None:
        self.written += data

    def close(self) -> None:
        pass


async def _app_that_waits(scope, receive, send) -> None:
    await asyncio.sleep(3600)  # the route has not asked for the body yet


def _drive(request: bytes, max_body_bytes: int = 64 * 1024 * 1024) -> tuple[int, list[int]]:
    """(how often the protocol paused the socket, the socket read size after each read) while
    `request` arrived in 64 KiB reads."""

    async def drive() -> tuple[int, list[int]]:
        config = uvicorn_config(_app_that_waits, Settings(max_body_bytes=max_body_bytes))
        config.load()
        state = ServerState()
        protocol = GuardedH11(config, state, app_state={})
        transport = RecordingTransport()
        protocol.connection_made(transport)
        sizes = []
        for start in range(0, len(request), 65536):
            protocol.data_received(request[start : start + 65536])
            sizes.append(transport.max_size)
        await asyncio.sleep(0)
        for task in state.tasks:
            task.cancel()
        protocol.connection_lost(None)
        return transport.pauses, sizes

    return asyncio.run(drive())


def _pauses(request: bytes, max_body_bytes: int = 64 * 1024 * 1024) -> int:
    return _drive(request, max_body_bytes)[0]


def _post(body: bytes) -> bytes:
    return b"POST /v1/segment HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body) + body


FRAME = b"\0" * (2_000_000)  # a KITTI frame's size


def test_a_declared_frame_streams_in_without_a_pause():
    assert _pauses(_post(FRAME)) == 0


def test_reads_take_the_declared_body_at_once_then_asyncios_size_again():
    _, sizes = _drive(_post(FRAME) + _post(b"x" * 16))
    assert sizes[0] == len(FRAME)  # the headers and the first part of the body
    assert sizes[-1] == RecordingTransport.max_size  # the body done, the next one tiny


def test_a_body_over_the_bound_pauses_as_uvicorn_does():
    big = b"\0" * (READ_AHEAD_BYTES + 1)
    assert _pauses(_post(big)) >= 1
    # the service's own body limit bounds read-ahead too
    assert _pauses(_post(FRAME), max_body_bytes=1024 * 1024) >= 1


def test_read_ahead_over_every_connection_is_bounded(monkeypatch):
    """Past ReadAheadH11.read_ahead_total (lowered to one and a half frames here) a second body
    under way streams under uvicorn's pause; the reservations end with the bodies (whole, or
    their connections gone). 200 connections reading 8 MiB ahead each took 2.3 GB."""
    monkeypatch.setattr(ReadAheadH11, "read_ahead_total", len(FRAME) * 3 // 2)

    async def drive() -> tuple[list[int], int, int]:
        config = uvicorn_config(_app_that_waits, Settings())
        config.load()
        state = ServerState()
        pairs = []
        for _ in range(2):
            protocol = GuardedH11(config, state, app_state={})
            transport = RecordingTransport()
            protocol.connection_made(transport)
            pairs.append((protocol, transport))
        request = _post(FRAME)
        for protocol, _ in pairs:  # both bodies under way at once: half of each sent
            for start in range(0, len(request) // 2, 65536):
                protocol.data_received(request[start : start + 65536])
        held = ReadAheadH11.held_everywhere
        first, _ = pairs[0]
        first.data_received(request[len(request) // 2 // 65536 * 65536 + 65536 :])
        after_first = ReadAheadH11.held_everywhere  # its body whole: only the refused one left
        await asyncio.sleep(0)
        for task in state.tasks:
            task.cancel()
        for protocol, _ in pairs:
            protocol.connection_lost(None)
        return [t.pauses for _, t in pairs], held - after_first, ReadAheadH11.held_everywhere

    before = ReadAheadH11.held_everywhere
    pauses, released, left = asyncio.run(drive())
    assert pauses[0] == 0 and pauses[1] >= 1, pauses
    assert released == len(FRAME) and left == before


def test_a_chunked_body_pauses_as_uvicorn_does():
    head = b"POST /v1/segment HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunks = b"".join(b"10000\r\n" + b"\0" * 65536 + b"\r\n" for _ in range(8))
    assert _pauses(head + chunks) >= 1


def test_a_pipelined_request_still_pauses_reading():
    # the first request's body is whole; h11 holds the second until the first is answered
    assert _pauses(_post(b"x" * 16) + _post(b"y" * 16)) >= 1


@pytest.mark.parametrize(
    "headers, length",
    [
        ([(b"host", b"t"), (b"content-length", b"2000000")], 2_000_000),
        ([(b"transfer-encoding", b"chunked")], None),
        ([(b"content-length", b"-1")], None),
        (None, None),
    ],
)
def test_declared_length(headers, length):
    assert declared_length(headers) == length


async def _echo_app(scope, receive, send) -> None:
    """Reads the whole body, keeps every message it got (scope["state"]["messages"]), answers
    with the body's length and the byte sum; /early answers without reading."""
    if scope["type"] != "http":
        return
    got = []
    if scope["path"] != "/early":
        while True:
            message = await receive()
            got.append(message)
            if message["type"] != "http.request" or not message["more_body"]:
                break
    scope["state"]["messages"].append(got)
    body = b"".join(m.get("body", b"") for m in got)
    answer = b"%d %d" % (len(body), sum(body))
    length = [(b"content-length", b"%d" % len(answer))]
    await send({"type": "http.response.start", "status": 200, "headers": length})
    await send({"type": "http.response.body", "body": answer})


def _exchange(reads: list[bytes], close: bool = False) -> tuple[list[list[dict]], bytes]:
    """The messages each request's app got and what the protocol wrote, the reads arriving one
    event-loop round apart; `close`: the client goes after the last read."""

    async def drive():
        config = uvicorn_config(_echo_app, Settings())
        config.load()
        messages: list[list[dict]] = []
        protocol = GuardedH11(config, ServerState(), app_state={"messages": messages})
        transport = RecordingTransport()
        protocol.connection_made(transport)
        for data in reads:
            protocol.data_received(data)
            for _ in range(5):
                await asyncio.sleep(0)
        if close:
            protocol.connection_lost(None)
        for _ in range(5):
            await asyncio.sleep(0)
        return messages, transport.written

    return asyncio.run(drive())


def _answers(written: bytes) -> list[bytes]:
    return [part.split(b"\r\n\r\n", 1)[1] for part in written.split(b"HTTP/1.1 ")[1:]]


def _summary(body: bytes) -> bytes:
    return b"%d %d" % (len(body), sum(body))


BODY = bytes(range(256)) * 4000  # 1,024,000 bytes, no two neighbours alike


def test_the_body_reaches_the_route_whole_past_h11():
    request = _post(BODY)
    head = len(request) - len(BODY)
    reads = [request[: head + 1000]] + [
        request[i : i + 300_001] for i in range(head + 1000, len(request), 300_001)
    ]
    (got,), written = _exchange(reads)
    assert b"".join(m["body"] for m in got) == BODY
    assert len(got) == 1 and not got[0]["more_body"]  # the route woke once, for the whole body
    assert _answers(written) == [_summary(BODY)]


def test_a_body_in_one_read_is_not_copied():
    request = _post(BODY)
    head = len(request) - len(BODY)
    rest = request[head:]
    (got,), _ = _exchange([request[:head], rest])
    assert got[-1]["body"] is rest  # the socket's read itself, not a copy


def test_a_pipelined_request_behind_the_body_is_h11s_as_ever():
    first, second = _post(BODY), _post(b"second body")
    (got1, got2), written = _exchange([first[:5000], first[5000:] + second])
    assert b"".join(m["body"] for m in got1) == BODY
    assert b"".join(m["body"] for m in got2) == b"second body"
    assert _answers(written) == [_summary(BODY), _summary(b"second body")]


def test_a_body_answered_before_it_arrived_is_dropped_and_the_next_request_served():
    early = b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(BODY)
    nxt = _post(b"after")
    (got_early, got_next), written = _exchange(
        [early + BODY[:10], BODY[10:500_000], BODY[500_000:] + nxt]
    )
    assert got_early == []
    assert b"".join(m["body"] for m in got_next) == b"after"
    assert _answers(written) == [_summary(b""), _summary(b"after")]


def test_a_client_gone_mid_body_is_a_disconnect():
    request = _post(BODY)
    (got,), _ = _exchange([request[:5000], request[5000:600_000]], close=True)
    assert got[-1]["type"] == "http.disconnect"


def test_the_route_keeps_a_body_in_one_message_uncopied():
    from starlette.requests import Request

    from app.service.routes.body import read_body
    from app.service.state import ServiceState

    async def read() -> tuple[bytes, bytes]:
        body = bytes(BODY)
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            return messages.pop(0)

        scope = {"type": "http", "method": "POST", "path": "/", "headers": []}
        got = await read_body(Request(scope, receive), ServiceState(Settings()))
        return got, body

    got, body = asyncio.run(read())
    assert got is body


def test_a_body_that_waits_for_100_continue_is_read_past_h11_too():
    head = b"POST /v1/segment HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
    head += b"Content-Length: %d\r\n\r\n" % len(BODY)
    (got,), written = _exchange([head, BODY[:300_000], BODY[300_000:]])
    assert written.startswith(b"HTTP/1.1 100 ")  # the route asked, uvicorn said continue
    assert len(got) == 1 and got[0]["body"] == BODY
    assert _answers(written)[-1] == _summary(BODY)
