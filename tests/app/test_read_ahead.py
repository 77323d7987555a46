"""GuardedH11's read-ahead (app/service/server.py): a body that declares a Content-Length up to
the bound streams in without uvicorn pausing the socket; a larger one, a chunked one and a
pipelined request behind a finished one still pause. The protocol is driven with bytes over a
recording transport, an ASGI app that never reads the body standing for a route not yet started.
"""

from __future__ import annotations

import asyncio

import pytest
from uvicorn.server import ServerState

from app.service.config import Settings
from app.service.server import READ_AHEAD_BYTES, GuardedH11, declared_length, uvicorn_config


class RecordingTransport(asyncio.Transport):
    """Counts pause_reading calls; has asyncio's socket read size (max_size), as its selector
    transports do."""

    max_size = 256 * 1024

    def __init__(self) -> None:
        super().__init__()
        self.pauses = 0

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
        pass

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
