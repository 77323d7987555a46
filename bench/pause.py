"""A frame's latency after a pause, against the same frame in a stream, per heap-trim setting.

    python -m bench.pause [--frame kitti00] [--pauses 0 1 3] [--runs 5]
                          [--config NAME=VAR=VALUE,...]... [--weights default]

The worker hands freed heap back to the OS (malloc_trim, app/heap.py) once it has had no job for
LIDARSEG_TRIM_IDLE_S; the frame after a trim maps the pipeline's buffers again, page by page.
This starts one server per --config (default: the shipped setting, the trim after 0.5 s as it
was up to 2026-12-03, and no trim at all), and per run, per pause, per server: waits until that
server has been idle for the pause (0: the frame right after another, a stream), posts the frame
(raw binary both ways, Python's http.client) and reads the server's Server-Timing, its minor
page faults (/proc/PID/stat) and its CPU time (its threads' schedstat: on a shared box the
steadier figure) around the request. "idle s" is how long the server had been idle (at least
the pause: the other servers' requests come between); the servers take turns, so drift hits all
alike. Printed per server and pause: medians of the round trip, the pipeline stages, the page
faults and the CPU time, and the round trip and CPU time over the same server's in a stream
(x1.00: the pause costs nothing).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from http.client import HTTPConnection
import urllib.parse

import numpy as np

from app.client import server_timing
from bench import common
from app.argtypes import positive_int

BINARY = {"Content-Type": "application/octet-stream", "Accept": "application/octet-stream"}
DEFAULT_CONFIGS = (
    "shipped=",
    "idle0.5s=LIDARSEG_TRIM_IDLE_S=0.5",
    "no-trim=LIDARSEG_TRIM_AFTER_POINTS=0",
)
STAGES = ("voxelize", "maps", "network")


def minor_faults(pid: int) -> int:
    """The process's minor page faults so far (all its threads): field 10 of /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def cpu_ns(pid: int) -> int:
    """CPU time the process's threads have run so far, ns (/proc/PID/task/*/schedstat; a
    thread that ended since is not counted, so only differences across a request are read)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


class Target:
    """One server: its process, a keep-alive connection and when it last answered."""

    def __init__(self, name: str, env: dict[str, str], weights: str):
        env = {"LIDARSEG_ACCESS_LOG": "off", "LIDARSEG_IDLE_TIMEOUT_S": "120", **env}
        self.name, (self.proc, url) = name, common.start_server(weights, 0.5, "cpu", env=env)
        parts = urllib.parse.urlsplit(url)
        self.conn = HTTPConnection(parts.hostname, parts.port, timeout=300)
        self.done = time.monotonic()

    def post(self, body: bytes, path: str) -> tuple[float, dict[str, float], int, float, float]:
        """(round trip ms, Server-Timing, the server's minor faults during the request, how
        long it had been idle before it (s), its CPU time during the request (ms))."""
        idle = time.monotonic() - self.done
        faults, cpu = minor_faults(self.proc.pid), cpu_ns(self.proc.pid)
        t = time.perf_counter()
        self.conn.request("POST", path, body=body, headers=BINARY)
        r = self.conn.getresponse()
        r.read()
        ms = (time.perf_counter() - t) * 1e3
        self.done = time.monotonic()
        if r.status != 200:
            raise SystemExit(f"{self.name}: HTTP {r.status}")
        faults = minor_faults(self.proc.pid) - faults
        cpu_ms = (cpu_ns(self.proc.pid) - cpu) / 1e6
        return ms, server_timing(r.getheader("server-timing", "")), faults, idle, cpu_ms

    def after_pause(self, pause: float, body: bytes, path: str):
        """The request once the server has been idle `pause` s; pause 0: right after another."""
        if pause <= 0:
            self.post(body, path)
        else:
            time.sleep(max(0.0, self.done + pause - time.monotonic()))
        return self.post(body, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frame", default="kitti00")
    ap.add_argument("--pauses", type=float, nargs="+", default=[0.0, 1.0, 3.0])
    ap.add_argument("--runs", type=positive_int, default=5)
    ap.add_argument("--weights", default="default")
    ap.add_argument("--config", action="append", default=None, help="NAME=VAR=VALUE,...")
    args = ap.parse_args(argv)
    frame = common.load_frame(args.frame)
    body = np.ascontiguousarray(frame.points, dtype=np.float32).tobytes()
    path = f"/v1/segment?format={common.sensor_of(frame.name)}"
    targets = []
    try:
        for text in args.config or DEFAULT_CONFIGS:
            targets.append(Target(*common.parse_config(text), args.weights))
        for t in targets:
            for _ in range(3):  # warm-up
                t.post(body, path)
        results: dict[tuple[str, float], list] = {}
        for _ in range(args.runs):
            for pause in args.pauses:
                for t in targets:
                    results.setdefault((t.name, pause), []).append(t.after_pause(pause, body, path))
        report(args, targets, results)
    finally:
        for t in targets:
            t.proc.terminate()
            t.proc.wait(30)
    return 0


def report(args, targets, results) -> None:
    print(
        f"frame {args.frame}, weights {args.weights}, median of {args.runs} runs; "
        "x = round trip / the same server's round trip in a stream (pause 0)"
    )
    print(
        f"{'server':<12}{'pause s':>8}{'idle s':>8}{'HTTP ms':>10}{'x':>7}"
        + "".join(f"{s:>10}" for s in STAGES)
        + f"{'faults':>9}{'CPU ms':>9}{'x CPU':>7}"
    )
    for t in targets:
        first = results[(t.name, min(args.pauses))]
        stream, stream_cpu = (statistics.median(r[i] for r in first) for i in (0, 4))
        for pause in args.pauses:
            rows = results[(t.name, pause)]
            ms = statistics.median(r[0] for r in rows)
            stages = [statistics.median(r[1].get(s, float("nan")) for r in rows) for s in STAGES]
            faults = statistics.median(r[2] for r in rows)
            idle, cpu = (statistics.median(r[i] for r in rows) for i in (3, 4))
            print(
                f"{t.name:<12}{pause:>8.1f}{idle:>8.2f}{ms:>10.1f}{ms / stream:>7.2f}"
                + "".join(f"{v:>10.1f}" for v in stages)
                + f"{faults:>9.0f}{cpu:>9.1f}{cpu / stream_cpu:>7.2f}"
            )


if __name__ == "__main__":
    raise SystemExit(main())
