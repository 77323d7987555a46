"""HTTP round trip vs the in-process pipeline on the same frames, side by side.

    python -m bench.service [--frames kitti00 nuscenes ouster128] [--weights default]
                            [--cr 1.0] [--device cpu] [--runs 7] [--precision auto]
                            [--url URL] [--json OUT]

Starts `python -m app serve` on a loopback port (unless --url points at a running one, which must
serve the same model), posts each frame as raw binary asking for binary labels
(application/octet-stream both ways), and times the same frame through SegmentationPipeline in
this process. The two are timed one after the other, never at once (they share the cores).
Overhead = HTTP round trip - in-process wall time, and its share of the round trip; the server's
own decode / queue / encode stages (Server-Timing) say where it goes. On a loaded machine the
pipeline itself varies more than the overhead: "service layer" (round trip minus the server's
own pipeline stages) isolates what HTTP, decoding, queueing and encoding cost. Each run also posts
the frame asking for JSON; per run it prints HTTP total (binary) / the server's network stage of
the same request, and JSON round trip - binary round trip (issue 16's two ratios), the latter
over the runs plus --json-pairs more (binary, JSON) pairs. The client is httpx (what app/client.py
uses); each run also posts the binary frame through Python's http.client on a keep-alive
connection of its own, a leaner client, and prints that round trip and its ratio too: the gap
between the two is the client's, not the service's. Beside each run, the same bytes (the frame
out, one byte a point back) go through a bare asyncio responder with that client
(bench/transport.py): the transport floor under the service layer.
"""

from __future__ import annotations

import argparse
import gc
from http.client import HTTPConnection
import json
import signal
import time
import urllib.parse

from app.heap import configure_malloc
from app.threads import configure_env

# Before torch loads libgomp and before any thread starts: the in-process pipeline runs under
# the server's settings. Its OpenMP waits passively (spinning threads left over from it would
# take the server's cores), and glibc's heap is set as the server's is (app/heap.py).
configure_env()
configure_malloc()

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from app.client import server_timing  # noqa: E402
from app.inference.builder import build_pipeline  # noqa: E402
from bench import common  # noqa: E402
from bench.service_report import (  # noqa: E402
    FrameSamples,
    print_header,
    report_ratios,
    report_times,
)
from bench.transport import floor_round_trips, floor_server  # noqa: E402

BINARY = {"Content-Type": "application/octet-stream", "Accept": "application/octet-stream"}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--frames", nargs="+", default=list(common.DEFAULT_FRAMES))
    ap.add_argument("--weights", default="default", help="default, random (with --cr) or a path")
    ap.add_argument("--cr", type=float, default=1.0, help="channel ratio of --weights random")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument(
        "--precision",
        default="auto",
        help="CPU precision of the server (LIDARSEG_PRECISION) and of the in-process pipeline",
    )
    ap.add_argument("--url", default=None)
    ap.add_argument(
        "--json-pairs",
        type=int,
        default=20,
        help="more (binary, JSON) request pairs per frame for the JSON - binary figure",
    )
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--observe",
        action="store_true",
        help="instead: tracing, exemplars, access log and request ring on vs off "
        "(bench/observe.py), per request and end to end",
    )
    return ap.parse_args(argv)


def json_pairs(remote, pairs: int) -> list[float]:
    """JSON round trip - binary round trip (ms) of `pairs` back-to-back pairs of the same frame,
    the order flipped every other pair so drift within a pair cancels."""
    diffs = []
    for i in range(pairs):
        ms = {}
        for accept in ("application/octet-stream", "application/json")[:: 1 if i % 2 else -1]:
            t = time.perf_counter()
            remote(accept)
            ms[accept] = (time.perf_counter() - t) * 1e3
        diffs.append(ms["application/json"] - ms["application/octet-stream"])
    return diffs


class FrameRuns:
    """One frame through the in-process pipeline, the server by httpx (binary and JSON) and by
    http.client, and the transport floor (bench/transport.py's bare responder at floor_port)."""

    def __init__(self, name: str, pipeline, http: httpx.Client, url: str, floor_port: int):
        self.name, self.pipeline, self.http, self.floor_port = name, pipeline, http, floor_port
        self.server = urllib.parse.urlsplit(url)
        self.points = np.ascontiguousarray(common.load_frame(name).points)
        # the raw format of the frame's sensor (intensity convention): the server reads the
        # frame as the in-process pipeline does
        self.sensor = common.sensor_of(name)
        self.body = self.points.tobytes()
        self.path = f"/v1/segment?format={self.sensor}"
        self.local_stages = []  # the pipeline's stages per local() call, the warm-up's first
        self.lean = None  # http.client's keep-alive connection, opened by measure()

    def local(self):
        result = self.pipeline.segment(self.points, self.sensor)
        self.local_stages.append(result.timing_ms)
        return result.labels

    def remote(self, accept="application/octet-stream") -> httpx.Response:
        r = self.http.post(
            self.path,
            content=self.body,
            headers={"Content-Type": "application/octet-stream", "Accept": accept},
        )
        r.raise_for_status()
        return r

    def remote_stdlib(self) -> tuple[float, dict[str, float]]:
        """(round trip ms, the server's stages) of the binary request through Python's
        http.client on its own keep-alive connection: the same request with a leaner client
        than httpx."""
        t = time.perf_counter()
        self.lean.request("POST", self.path, body=self.body, headers=BINARY)
        r = self.lean.getresponse()
        r.read()
        ms = (time.perf_counter() - t) * 1e3
        return ms, server_timing(r.getheader("server-timing", ""))

    def measure(self, runs: int, device: str) -> FrameSamples:
        """Warm-ups, then `runs` interleaved runs (in-process, httpx binary, httpx JSON,
        http.client, transport floor): drift hits them all alike."""
        s = FrameSamples(points=len(self.points))
        labels = self.local()  # warm-up
        # new keep-alive connections per frame: the server closes idle ones after
        # LIDARSEG_IDLE_TIMEOUT_S (5 s), shorter than a slow CPU's warm-up
        self.lean = HTTPConnection(self.server.hostname, self.server.port, timeout=300)
        bare = HTTPConnection("127.0.0.1", self.floor_port, timeout=60)
        floor_round_trips(bare, self.body, len(self.points), 3)  # warm-up
        gc.collect()
        gc.freeze()  # as the server does after its warm-up (app/service/main.py)
        r = self.remote()
        assert np.array_equal(np.frombuffer(r.content, np.uint8), labels), self.name
        for i in range(runs):
            common.sync(device)
            t = time.perf_counter()
            self.local()
            common.sync(device)
            s.local_ms.append((time.perf_counter() - t) * 1e3)
            # binary and JSON take turns going first: neither always follows the other
            for binary in (True, False)[:: 1 if i % 2 == 0 else -1]:
                t = time.perf_counter()
                r = self.remote("application/octet-stream" if binary else "application/json")
                ms = (time.perf_counter() - t) * 1e3
                (s.binary_ms if binary else s.json_ms).append(ms)
                stages = server_timing(r.headers["server-timing"])
                (s.binary_stages if binary else s.json_stages).append(stages)
            s.stdlib.append(self.remote_stdlib())
            s.floor_ms += floor_round_trips(bare, self.body, len(self.points), 1)
        s.local_stages = self.local_stages[1:]
        return s


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.observe:
        from bench import observe

        return observe.service_main(args)

    proc, url = (
        (None, args.url)
        if args.url
        else common.start_server(
            args.weights, args.cr, args.device, env={"LIDARSEG_PRECISION": args.precision}
        )
    )
    pipeline = build_pipeline(args.weights, args.device, args.cr, precision=args.precision)
    rows = []
    floor_proc = None
    try:
        floor_proc, floor_port = floor_server()
        with httpx.Client(base_url=url, timeout=300) as http:
            print_header(args.device, args.weights, pipeline.precision, args.runs)
            for name in args.frames:
                runs = FrameRuns(name, pipeline, http, url, floor_port)
                samples = runs.measure(args.runs, args.device)
                row = report_times(name, samples)
                rows.append(row)
                report_ratios(row, samples, json_pairs(runs.remote, args.json_pairs))
    finally:
        if floor_proc is not None:
            floor_proc.terminate()
            floor_proc.wait(10)
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": args.device,
                    "weights": args.weights,
                    "cr": args.cr,
                    "runs": args.runs,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
