"""The transport floor: what moving a frame's bytes through loopback HTTP costs with no service.

    python -m bench.transport [--frames kitti00 nuscenes] [--runs 30]

A bare asyncio HTTP/1.1 responder (no parser library, no framework, no thread hand-off) in its
own process reads a POST body of the frame's size and answers with as many bytes as the frame
has points (the binary labels' size); Python's http.client posts to it on a keep-alive
connection, as bench.service's lean client does. The round trip is the floor under bench.service's
"service layer": what is left above it is h11, Starlette, our middlewares and the worker
hand-offs. The responder's heap is set as the server's (app/heap.py). bench.service prints both
side by side (floor_server / floor_round_trips below);
run alone, this prints the floor per frame.
"""

from __future__ import annotations

import argparse
import asyncio
from http.client import HTTPConnection
import socket
import statistics
import subprocess
import sys
import time

REPLY_HEADER = "x-reply-bytes"  # how many body bytes the responder answers with


class _Responder(asyncio.Protocol):
    """Answers each complete request (Content-Length bodies only) with REPLY_HEADER bytes."""

    def connection_made(self, transport) -> None:
        self.transport, self.data, self.want, self.reply = transport, bytearray(), None, 0

    def data_received(self, chunk: bytes) -> None:
        self.data += chunk
        while True:
            if self.want is None:
                end = self.data.find(b"\r\n\r\n")
                if end < 0:
                    return
                headers = dict(
                    line.split(":", 1)
                    for line in self.data[:end].decode("latin-1").split("\r\n")[1:]
                )
                headers = {k.strip().lower(): v.strip() for k, v in headers.items()}
                self.want = end + 4 + int(headers.get("content-length", 0))
                self.reply = int(headers.get(REPLY_HEADER, 0))
            if len(self.data) < self.want:
                return
            del self.data[: self.want]
            self.want = None
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {self.reply}\r\n\r\n".encode()
            self.transport.write(head + bytes(self.reply))


async def _serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_Responder, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def floor_server() -> tuple[subprocess.Popen, int]:
    """The responder in a process of its own on a free loopback port: (process, port)."""
    from bench import common  # here, not above: the responder's own process needs no torch

    port = common.free_port()
    cmd = [sys.executable, "-m", "bench.transport", "--serve", str(port)]
    proc = subprocess.Popen(cmd, cwd=common.REPO_ROOT)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the transport floor's responder did not start")


def floor_round_trips(
    conn: HTTPConnection, body: bytes, reply_bytes: int, runs: int
) -> list[float]:
    """`runs` round trips (ms) of `body` out and `reply_bytes` back on the keep-alive `conn`."""
    headers = {"Content-Type": "application/octet-stream", REPLY_HEADER: str(reply_bytes)}
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        conn.request("POST", "/", body=body, headers=headers)
        reply = conn.getresponse().read()
        out.append((time.perf_counter() - t) * 1e3)
        assert len(reply) == reply_bytes
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--frames", nargs="+", default=["kitti00", "nuscenes"])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve is not None:
        from app.heap import configure_malloc

        configure_malloc()  # glibc's heap as the server sets it: buffers reused, not faulted in
        asyncio.run(_serve(args.serve))
        return 0
    from bench import common

    proc, port = floor_server()
    try:
        conn = HTTPConnection("127.0.0.1", port, timeout=60)
        print("frame        points  body bytes   floor ms (median [min..max])")
        for name in args.frames:
            points = common.load_frame(name).points
            body = points.tobytes()
            ms = floor_round_trips(conn, body, len(points), args.runs + 3)[3:]
            print(
                f"{name:<11}{len(points):>8}{len(body):>12}   {statistics.median(ms):.2f} "
                f"[{min(ms):.2f}..{max(ms):.2f}]"
            )
    finally:
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
