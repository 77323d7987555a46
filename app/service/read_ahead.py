"""uvicorn's h11 protocol, reading a small declared body ahead and straight into the request.

A body that declares a Content-Length up to READ_AHEAD_BYTES (and within LIDARSEG_MAX_BODY_BYTES)
  - streams in while the route starts: uvicorn stops reading once 64 KiB wait for the app and
    reads on only when the route asks, 256 KiB a round (a 2 MB frame took nine event-loop rounds
    after the route began); here the socket is not paused while such a body arrives
    (ReadAhead), and each socket read takes up to the body's length at once;
  - goes past h11: once h11 has parsed the headers (and handed over the body bytes that came with
    them), the socket's reads are kept as they come and joined once when the last one arrives,
    instead of each byte being copied into h11's buffer, sliced out twice, appended to uvicorn's
    bytearray and copied into the ASGI message (five copies of a 2 MB frame, about 1 ms on
    a Zen 1 core). h11 is then told the body is whole (its Content-Length reader's count, h11
    pinned in requirements/service.txt) and ends the request as it always does. The route gets
    the whole body in one message.
Chunked bodies, larger ones, those past READ_AHEAD_TOTAL_BYTES over every connection and
pipelined requests keep uvicorn's flow control, h11's reading and asyncio's read size. The bytes
held are bounded by the declared length, as uvicorn's would be.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from h11._readers import ContentLengthReader
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol

# A declared body up to this size is read without pausing (a 128-beam frame is about 2 MB): at
# most this much more is held per connection than under uvicorn's 64 KiB pause, and only until
# the route reads the body, which it does for every request it admits.
READ_AHEAD_BYTES = 8 * 1024 * 1024
# The bodies read ahead at once over every connection (a route that never reads its body, or a
# flood of slow ones, holds them until they are whole): beyond, a body streams under uvicorn's
# flow control as a larger one does. 200 connections reading 8 MiB each ahead took a server from
# 656 MB to 2.3 GB.
READ_AHEAD_TOTAL_BYTES = 64 * 1024 * 1024


def declared_length(headers: list[tuple[bytes, bytes]] | None) -> int | None:
    """A request's Content-Length (headers as uvicorn keeps them: lower-case names), None when
    it has none or a bad one (h11 refuses those)."""
    for name, value in headers or ():
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class ReadAhead(FlowControl):
    """uvicorn's flow control, except that it does not pause while the protocol reads a body
    ahead (ReadAheadH11.read_ahead_length)."""

    def __init__(self, transport: asyncio.Transport, protocol: ReadAheadH11) -> None:
        super().__init__(transport)
        self._protocol = protocol

    def pause_reading(self) -> None:
        if self._protocol.read_ahead_length() is None:
            super().pause_reading()


class ReadAheadH11(H11Protocol):
    """uvicorn's h11 protocol with read-ahead (see the module doc)."""

    read_ahead_bytes = READ_AHEAD_BYTES  # a subclass may lower it per connection
    read_ahead_total = READ_AHEAD_TOTAL_BYTES
    held_everywhere = 0  # bytes reserved by every connection's read-ahead (one event loop)
    _held = 0  # this connection's reservation, for its body under way
    _held_cycle: object = None  # the request whose body the reservation was decided for
    _body_parts: list[bytes] | None = None  # a read-ahead body's reads since h11 handed over
    _body_left = 0  # its bytes still to come

    def read_ahead_length(self) -> int | None:
        """The declared length of the body under way when it is read whole at once (small
        enough, and within read_ahead_total over every connection), else None."""
        if self.cycle is None or self.conn.their_state is not h11.SEND_BODY:
            return None  # no body under way (h11.PAUSED: a pipelined request waits)
        if self._held_cycle is not self.cycle:
            self._reserve()
        return self._held or None

    def _reserve(self) -> None:
        """Decides once per request whether its body is read ahead, and reserves its length."""
        self._held_cycle = self.cycle
        length = declared_length(self.headers)
        if length is None or length > self.read_ahead_bytes:
            return
        if ReadAheadH11.held_everywhere + length <= self.read_ahead_total:
            ReadAheadH11.held_everywhere += length
            self._held = length

    def _release(self) -> None:
        ReadAheadH11.held_everywhere -= self._held
        self._held = 0

    def connection_lost(self, exc) -> None:
        self._release()
        super().connection_lost(exc)

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.flow = ReadAhead(transport, self)

    def data_received(self, data: bytes) -> None:
        if self._body_parts is None:
            super().data_received(data)
        else:
            self._unset_keepalive_if_required()
            self._take_body(data)

    def handle_events(self) -> None:
        super().handle_events()
        length = self.read_ahead_length()
        if length is None and self._held:
            self._release()  # the body is whole (or its request ended)
        self._size_reads(length)
        if length is not None and self._body_parts is None:
            self._take_over_body()

    def _take_over_body(self) -> None:
        """After h11 has parsed a read-ahead body's headers and the bytes that came with them,
        the rest goes past h11 (_take_body)."""
        reader = self.conn._reader
        if isinstance(reader, ContentLengthReader) and reader._remaining > 0:
            self._body_parts, self._body_left = [], reader._remaining
            # The route (its task not yet run) hears of the body when it is whole, so it gets
            # one message and joins nothing.
            self.cycle.message_event.clear()

    def _take_body(self, data: bytes) -> None:
        parts = self._body_parts
        assert parts is not None
        if len(data) < self._body_left:
            parts.append(data)
            self._body_left -= len(data)
            return
        rest = data[self._body_left :] if len(data) > self._body_left else b""
        parts.append(data[: self._body_left] if rest else data)
        self._body_parts, self._body_left = None, 0
        if self.conn.our_state is not h11.DONE:  # else answered already: the body is dropped
            if self.cycle.body:
                parts.insert(0, self.cycle.body)  # what h11 handed over, not yet asked for
            self.cycle.body = parts[0] if len(parts) == 1 else b"".join(parts)  # type: ignore[assignment]
        reader = self.conn._reader
        assert isinstance(reader, ContentLengthReader)
        reader._remaining = 0  # h11's next event: the end of the body
        if rest:
            self.conn.receive_data(rest)  # a pipelined request: h11's as ever
        self.handle_events()  # the end of the body wakes the route, as uvicorn's reading does

    def _size_reads(self, length: int | None) -> None:
        """While a body is read ahead (`length`: read_ahead_length's), socket reads take up to
        its declared length at once (asyncio's selector transport reads max_size bytes a call,
        256 KiB); else asyncio's own size. recv() allocates what it is asked for and shrinks it
        to what came."""
        transport: Any = self.transport  # max_size: asyncio's selector transports only
        default = getattr(type(transport), "max_size", None)
        if default is None:
            return  # not asyncio's socket transport (TLS, uvloop): its own reads
        if length is not None:
            transport.max_size = max(length, default)
        elif "max_size" in vars(transport):
            del transport.max_size  # the class's value again
