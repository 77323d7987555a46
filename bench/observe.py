"""What tracing, exemplars, the access log and the request ring cost per request, on versus off,
measured on real servers from the outside.

    python -m bench.observe [--frame kitti00] [--points 1] [--requests 200] [--rounds 10]

One `python -m app serve` per configuration (random cr 0.25 model), all running at once; the
same frame (the first --points points of a real frame, binary in and out) is posted --requests
times to each server in turn, round after round, so a noisy machine hits every configuration
alike. Per round and server: the server's CPU time per request, summed over all its threads
(/proc/PID/task/*/schedstat, nanoseconds: the span exporter's thread counts) and the client's
wall time per request. Printed: the median over rounds per configuration, and the median over
rounds of its difference from "off" in the same round (drift between rounds cancels), with the
spread of those differences. A one-point frame (the default) keeps the pipeline's own cost, the
same in every configuration, at about 8 ms, so the features' fraction of a millisecond shows.
None of the four does work that grows with the frame: spans, exemplars and the log line carry
counts, and the ring keeps references to the request's own point and label arrays (no copy), so
the one-point figure is the figure for a 125k-point frame too. `--points 124668` runs the same
check on the whole frame, where the pipeline's own +-30 ms per round hides a millisecond.

Configurations (settings and OTEL_* variables of each server):
  off        LIDARSEG_ACCESS_LOG=off, LIDARSEG_EXEMPLARS=false, LIDARSEG_DASHBOARD_REQUESTS=0
  trace      off + spans exported over OTLP/HTTP (BatchSpanProcessor) to a sink in another process
  exemplars  off + LIDARSEG_EXEMPLARS=true
  log        off + LIDARSEG_ACCESS_LOG=json (the server's stdout to /dev/null)
  ring       off + LIDARSEG_DASHBOARD_REQUESTS=200 (keeping the points for the 3D view)
  on         all four

`python -m bench.service --observe` prints this table too.
"""

from __future__ import annotations

import argparse
import glob
import statistics
import subprocess
import sys
import time

import httpx
import numpy as np

from bench import common

SINK = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""
OFF = {
    "LIDARSEG_ACCESS_LOG": "off",
    "LIDARSEG_EXEMPLARS": "false",
    "LIDARSEG_DASHBOARD_REQUESTS": "0",
}
FEATURES = {
    "trace": lambda sink: {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink}"},
    "exemplars": lambda sink: {"LIDARSEG_EXEMPLARS": "true"},
    "log": lambda sink: {"LIDARSEG_ACCESS_LOG": "json"},
    "ring": lambda sink: {"LIDARSEG_DASHBOARD_REQUESTS": "200"},
}
CONFIGS = {
    "off": (),
    "trace": ("trace",),
    "exemplars": ("exemplars",),
    "log": ("log",),
    "ring": ("ring",),
    "on": tuple(FEATURES),
}
HEADERS = {"Content-Type": "application/octet-stream", "Accept": "application/octet-stream"}


def environment(config: str, sink_port: int) -> dict:
    env = dict(OFF)
    for feature in CONFIGS[config]:
        env.update(FEATURES[feature](sink_port))
    return env


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of the process so far (ns; threads that ended are not counted,
    and the server's threads live as long as it does)."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            pass
    return total


def start_sink() -> tuple[subprocess.Popen, int]:
    sink = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    assert sink.stdout is not None
    return sink, int(sink.stdout.readline())


def one_round(http, proc, url: str, body: bytes, n: int, fmt: str) -> tuple[float, float]:
    """(server CPU us per request, client wall us per request) over n requests."""
    cpu0, t0 = cpu_ns(proc.pid), time.perf_counter()
    for _ in range(n):
        http.post(f"{url}/v1/segment?format={fmt}", content=body, headers=HEADERS)
    wall = (time.perf_counter() - t0) / n * 1e6
    time.sleep(0.3)  # work after the last response (spans ended, access log) lands in this round
    return (cpu_ns(proc.pid) - cpu0) / n / 1e3, wall


def measure(frame: str, points: int, n: int, rounds: int, weights="random", cr=0.25) -> dict:
    body = np.ascontiguousarray(common.load_frame(frame).points[:points]).tobytes()
    sink, port = start_sink()
    servers = {}
    try:
        for config in CONFIGS:
            servers[config] = common.start_server(
                weights,
                cr,
                "cpu",
                environment(config, port),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        samples: dict[str, list[tuple[float, float]]] = {c: [] for c in CONFIGS}
        with httpx.Client(timeout=600) as http:
            for r in range(rounds + 1):  # round 0 warms up
                for config, (proc, url) in servers.items():
                    result = one_round(http, proc, url, body, n, common.sensor_of(frame))
                    if r:
                        samples[config].append(result)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(60)
        sink.terminate()
        sink.wait(10)
    off = samples["off"]
    out = {}
    for c, v in samples.items():
        # paired with "off" of the same round: drift between rounds cancels
        diff = [x[0] - o[0] for x, o in zip(v, off)]
        out[c] = {
            "cpu_us": statistics.median(x[0] for x in v),
            "wall_us": statistics.median(x[1] for x in v),
            "cpu_vs_off_us": statistics.median(diff),
            "cpu_vs_off_spread_us": (min(diff), max(diff)),
            "wall_vs_off_us": statistics.median(x[1] - o[1] for x, o in zip(v, off)),
        }
    return out


def report(res: dict, frame: str, points: int, n: int, rounds: int) -> None:
    print(
        f"{frame}, first {points} points, {n} requests x {rounds} rounds per server, "
        "medians per request (server CPU of all threads; client wall):"
    )
    print(
        f"{'config':<10}{'cpu us':>10}{'vs off':>10}{'wall us':>10}{'vs off':>10}"
        "   cpu vs off, per round"
    )
    for c, v in res.items():
        lo, hi = v["cpu_vs_off_spread_us"]
        print(
            f"{c:<10}{v['cpu_us']:>10.0f}{v['cpu_vs_off_us']:>+10.0f}"
            f"{v['wall_us']:>10.0f}{v['wall_vs_off_us']:>+10.0f}   {lo:+.0f}..{hi:+.0f}"
        )


def service_main(args) -> int:
    """bench.service --observe: the same table, on the first frame asked for."""
    frame = args.frames[0] if args.frames else "kitti00"
    res = measure(frame, 1, 200, max(args.runs, 3))
    report(res, frame, 1, 200, max(args.runs, 3))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--frame", default="kitti00")
    ap.add_argument("--points", type=int, default=1)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args(argv)
    report(
        measure(a.frame, a.points, a.requests, a.rounds), a.frame, a.points, a.requests, a.rounds
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
