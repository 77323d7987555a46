"""Goodput under a tight deadline: answered frames per second and frames inferred in vain.

    python -m bench.goodput [--frame nuscenes] [--clients 8] [--seconds 40] [--deadline 0]
                            [--weights random --cr 0.25] [--max-batch 4]

Runs the server twice, one after the other, with the same closed loop of clients posting the same
frame: once with a generous deadline (30 s) and once with a tight one (--deadline; 0 = 2.5 x the
frame's measured single-request latency). For each it prints requests by status, goodput (200s
per second) and wasted frames: frames the worker ran whose client had already been answered 504
(frames run, from lidarseg_batch_size_sum, minus 200s). Issue 15's before: 8 of 276 requests
answered and 59 of 67 inferred frames wasted at a 0.8 s deadline with 8 clients. The target: the
tight run reaches the generous run's goodput less the frames it has to refuse.
"""

from __future__ import annotations

import argparse
import collections
import json
import threading
import time

import httpx
import numpy as np

from app.client import metric_value
from bench import common
from bench.common import start_server


def closed_loop(url: str, body: bytes, fmt: str, clients: int, seconds: float) -> dict:
    statuses: collections.Counter = collections.Counter()
    lock, stop = threading.Lock(), time.monotonic() + seconds

    def client():
        with httpx.Client(base_url=url, timeout=120) as c:
            while time.monotonic() < stop:
                r = c.post(
                    f"/v1/segment?format={fmt}",
                    content=body,
                    headers={"Accept": "application/octet-stream"},
                )
                with lock:
                    statuses[r.status_code] += 1
                if r.status_code == 503:
                    time.sleep(float(r.headers.get("retry-after", "1")) / 10)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"statuses": dict(statuses), "seconds": time.monotonic() - t0}


def run(args, deadline: float, body: bytes, fmt: str) -> dict:
    proc, url = start_server(
        args.weights,
        args.cr,
        "cpu",
        {"LIDARSEG_DEADLINE_S": str(deadline), "LIDARSEG_MAX_BATCH": str(args.max_batch)},
    )
    try:
        for _ in range(2):  # warm the server with the frame
            httpx.post(f"{url}/v1/segment?format={fmt}", content=body, timeout=120)
        before = metric_value(httpx.get(f"{url}/metrics").text, "lidarseg_batch_size_sum")
        out = closed_loop(url, body, fmt, args.clients, args.seconds)
        ran = metric_value(httpx.get(f"{url}/metrics").text, "lidarseg_batch_size_sum") - before
    finally:
        proc.terminate()
        proc.wait(60)
    ok = out["statuses"].get(200, 0)
    return {
        "deadline_s": deadline,
        **out,
        "frames_run": int(ran),
        "answered": ok,
        "wasted_frames": int(ran) - ok,
        "goodput_fps": ok / out["seconds"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--frame", default="nuscenes")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--deadline", type=float, default=0.0)
    ap.add_argument("--weights", default="random")
    ap.add_argument("--cr", type=float, default=0.25)
    ap.add_argument("--max-batch", type=int, default=4)
    args = ap.parse_args(argv)
    frame = common.load_frame(args.frame)
    fmt = common.sensor_of(frame.name)
    body = np.ascontiguousarray(frame.points, np.float32).tobytes()

    generous = run(args, 30.0, body, fmt)
    single = generous["seconds"] * args.clients / max(1, generous["answered"])  # latency
    tight = args.deadline or round(2.5 * single / args.clients, 3)
    strict = run(args, tight, body, fmt)
    for r in (generous, strict):
        print(
            f"deadline {r['deadline_s']:>6} s: statuses {r['statuses']}, goodput "
            f"{r['goodput_fps']:.2f} frames/s, frames run {r['frames_run']}, wasted "
            f"{r['wasted_frames']}"
        )
    print(
        f"goodput ratio tight / generous: {strict['goodput_fps'] / generous['goodput_fps']:.2f}"
        f"; wasted share (tight): {strict['wasted_frames'] / max(1, strict['frames_run']):.2f}"
    )
    print(json.dumps({"generous": generous, "tight": strict}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
