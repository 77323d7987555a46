"""A sensor's stream: frames posted at the sensor's rate whatever the answers are doing.

    python -m bench.stream [--hz 10] [--seconds 30] [--sequential 20] [--deadline-ms 200]
                           [--stream-id lidar] [--frames F ...] [--weights default]
                           [--precision auto] [--device cpu] [--url URL] [--json OUT]

bench.service times a frame alone (one request at a time: item 5's figure). A LiDAR driver does
not wait for an answer before publishing its next scan: here frame i is due at t0 + i / hz and is
posted then (open loop, a thread each, keep-alive connections of their own), so a frame that runs
long makes the next one wait in the server's queue. In the same run, first, the same frames are
posted back to back (closed loop): the two side by side say what the stream's pacing costs.
Then the stream again with X-Deadline-Ms (--deadline-ms, default two periods; 0: skip): where
the server cannot keep up, frames it cannot answer in time are refused (504) instead of queued,
and the answered ones stay fresh. Then once more with X-Stream-Id (--stream-id; '': skip) and
no deadline: each frame drops its stream's older frames still queued (409 superseded), so the
server always works on the newest scan.

Latency is from a frame's due time to the last byte of its answer (a frame whose thread started
late is charged for it), over the answered frames (200). Printed for each: median, p90, p99 and
max, the share of answered frames later than one period (1 / hz: after the next scan was due),
the frames not answered (504 past a deadline, 409 superseded, 503), and the server's own queue
and network stages (Server-Timing medians). Frames: six consecutive scans of
SemanticKITTI sequence 04 (a 10 Hz drive, 123-124k points each), posted raw (float32 x, y, z,
intensity) asking for one label byte a point.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection, HTTPException
from urllib.parse import urlsplit

import numpy as np

from app.client import server_timing
from bench import common

FRAMES = tuple(f"semantickitti/seq04_00000{i}.bin" for i in range(6))
HEADERS = {"Content-Type": "application/octet-stream", "Accept": "application/octet-stream"}
WARM_UPS = 3


class Poster:
    """Posts frame bodies on keep-alive connections, one per thread."""

    def __init__(
        self, url: str, bodies: list[bytes], deadline_ms: float = 0.0, stream_id: str = ""
    ):
        self.server, self.bodies = urlsplit(url), bodies
        self.headers = dict(HEADERS)
        if deadline_ms:
            self.headers["X-Deadline-Ms"] = f"{deadline_ms:g}"
        if stream_id:
            self.headers["X-Stream-Id"] = stream_id
        self.local = threading.local()

    def post(self, i: int, due: float) -> dict:
        """Frame i (cycling through the bodies), due at perf_counter() == due. A connection the
        server closed (idle past its keep-alive timeout, or after a refusal) is replaced once."""
        body = self.bodies[i % len(self.bodies)]
        for attempt in (0, 1):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = HTTPConnection(
                    self.server.hostname, self.server.port, timeout=60
                )
            try:
                conn.request("POST", "/v1/segment?format=kitti", body, self.headers)
                r = conn.getresponse()
                r.read()
            except (OSError, HTTPException):
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
                continue
            if (r.getheader("connection") or "").lower() == "close":
                conn.close()
                self.local.conn = None
            ms = (time.perf_counter() - due) * 1e3
            stages = server_timing(r.getheader("server-timing", ""))
            return {"ms": ms, "status": r.status, "stages": stages}
        raise AssertionError("unreachable")


def sequential(poster: Poster, count: int) -> list[dict]:
    out = []
    for i in range(count):
        out.append(poster.post(i, time.perf_counter()))
    return out


def stream(poster: Poster, hz: float, count: int) -> list[dict]:
    """`count` frames, frame i posted at t0 + i / hz (a thread each, at most 8 at once)."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        t0 = time.perf_counter() + 0.05
        futures = []
        for i in range(count):
            due = t0 + i / hz
            time.sleep(max(0.0, due - time.perf_counter()))
            futures.append(pool.submit(poster.post, i, due))
        return [f.result() for f in futures]


def summary(results: list[dict], period_ms: float) -> dict:
    """Latency figures of the answered frames (NaN when none was), and how many were not."""
    answered = [r for r in results if r["status"] == 200]
    ms = np.array([r["ms"] for r in answered]) if answered else np.full(1, np.nan)
    stage = {
        s: float(np.median([r["stages"].get(s, 0.0) for r in answered])) if answered else np.nan
        for s in ("queue", "network")
    }
    return {
        "frames": len(results),
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "late_share": float(np.mean(ms > period_ms)),
        "not_200": len(results) - len(answered),
        "queue_ms": stage["queue"],
        "network_ms": stage["network"],
    }


def print_row(name: str, s: dict) -> None:
    print(
        f"{name:<11}{s['frames']:>7}{s['p50_ms']:>9.1f}{s['p90_ms']:>9.1f}{s['p99_ms']:>9.1f}"
        f"{s['max_ms']:>9.1f}{s['late_share'] * 100:>8.1f}{s['not_200']:>6}"
        f"{s['queue_ms']:>8.1f}{s['network_ms']:>9.1f}"
    )


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--sequential", type=int, default=20, help="back-to-back frames first")
    ap.add_argument(
        "--deadline-ms",
        type=float,
        default=None,
        help="X-Deadline-Ms of the second stream (default: two periods; 0: no second stream)",
    )
    ap.add_argument(
        "--stream-id", default="lidar", help="X-Stream-Id of the third stream ('': none)"
    )
    ap.add_argument("--frames", nargs="+", default=list(FRAMES))
    ap.add_argument("--weights", default="default")
    ap.add_argument("--precision", default="auto", help="LIDARSEG_PRECISION of the server")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--url", default=None, help="a running server (same model) instead")
    ap.add_argument("--json", default=None)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    bodies = [np.ascontiguousarray(common.load_frame(f).points).tobytes() for f in args.frames]
    env = {"LIDARSEG_PRECISION": args.precision, "LIDARSEG_ACCESS_LOG": "off"}
    proc, url = (
        (None, args.url) if args.url else common.start_server(args.weights, 1.0, args.device, env)
    )
    period_ms = 1e3 / args.hz
    deadline_ms = 2 * period_ms if args.deadline_ms is None else args.deadline_ms
    count = round(args.seconds * args.hz)
    try:
        poster = Poster(url, bodies)
        sequential(poster, WARM_UPS)
        rows = {
            "sequential": summary(sequential(poster, args.sequential), period_ms),
            "stream": summary(stream(poster, args.hz, count), period_ms),
        }
        if deadline_ms:
            time.sleep(2.0)  # the first stream's backlog drains
            with_deadline = stream(Poster(url, bodies, deadline_ms), args.hz, count)
            rows["stream_deadline"] = summary(with_deadline, period_ms)
        if args.stream_id:
            time.sleep(2.0)
            superseding = stream(Poster(url, bodies, stream_id=args.stream_id), args.hz, count)
            rows["stream_superseding"] = summary(superseding, period_ms)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    print(f"# {len(bodies)} frames cycled, {args.hz:g} Hz (period {period_ms:.0f} ms), "
          f"weights {args.weights}, precision {args.precision}, device {args.device}")  # fmt: skip
    print("# latency ms from each frame's due time; late: share answered after one period")
    print("# of answered frames; !200: frames not answered (504 past a deadline, 409")
    print("# superseded by a newer frame of the stream, 503)")
    print(f"{'':<11}{'frames':>7}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}{'late %':>8}"
          f"{'!200':>6}{'queue':>8}{'network':>9}")  # fmt: skip
    labels = {"stream_deadline": f"+{deadline_ms:g} ms", "stream_superseding": "+stream id"}
    for name, s in rows.items():
        print_row(labels.get(name, name), s)
    ratio = rows["stream"]["p50_ms"] / rows["sequential"]["p50_ms"]
    print(f"stream p50 / sequential p50: x{ratio:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"hz": args.hz, "device": args.device, "deadline_ms": deadline_ms, **rows},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
