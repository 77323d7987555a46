"""Soak: mixed formats and sizes from several clients for minutes; the server's RSS over time.

    python -m bench.soak [--minutes 3] [--clients 4] [--warmup 0.25] [--weights random --cr 0.25]
                         [--config NAME=VAR=VALUE,VAR=VALUE ...]

Each --config runs its own server (one after the other) with those environment variables, e.g.
  --config glibc=LIDARSEG_TRIM_AFTER_POINTS=0
  --config arena2=MALLOC_ARENA_MAX=2     (the containers' setting before app/heap.py)
  --config shipped=                       (app/heap.py's malloc settings plus the built-in trim)
Clients post real frames (and slices of them, 1 k to 125 k points) as kitti, ouster, nuscenes, pcd
(binary, binary_compressed, ascii), ply, npy, las, pointcloud2 and json, picked at random with a
fixed seed. The server's VmRSS is sampled every second. At the end of the warm-up (--warmup, a
fraction of the run) the clients pause between requests and, once the server has been idle for
its heap trim's pause (LIDARSEG_TRIM_IDLE_S, 1 s here unless a --config sets it) and 1.5 s more,
RSS is read "at rest"; the same at the end. Printed: RSS at start (ready), at rest after the warm-up
and at the end, the growth between those two (target < 10 %: the same idle state compared, so
in-flight frames do not count), the samples under load and the peak, and requests by status.
"""

from __future__ import annotations

import argparse
import collections
import json
import threading
import time

import httpx
import numpy as np

from app.codecs.encode import encode
from bench import common
from bench.common import start_server

# The servers' heap-trim pause (unless a --config sets LIDARSEG_TRIM_IDLE_S): shorter than the
# shipped one, so that a reading at rest comes soon; the trim itself is the same.
TRIM_IDLE_S = "1"
VARIANTS = [
    "kitti",
    "ouster",
    "nuscenes",
    "pcd_binary",
    "pcd_binary_compressed",
    "ply_binary_little_endian",
    "npy",
    "las",
    "pointcloud2",
    "pcd_ascii",
    "json",
]
TEXT = {"pcd_ascii", "json"}


def bodies(seed: int = 0, count: int = 40) -> list[tuple[bytes, str]]:
    rng = np.random.default_rng(seed)
    frames = [common.load_frame(n).points for n in ("kitti00", "nuscenes", "ouster128")]
    out = []
    for _ in range(count):
        pts = frames[rng.integers(len(frames))]
        variant = VARIANTS[rng.integers(len(VARIANTS))]
        top = 20_000 if variant in TEXT else len(pts)
        n = int(rng.integers(1_000, min(top, len(pts)) + 1))
        sel = np.ascontiguousarray(pts[rng.choice(len(pts), n, replace=False)], np.float32)
        if variant == "nuscenes" and sel.shape[1] < 5:
            sel = np.column_stack([sel, np.zeros(n, np.float32)])
        body, ctype = encode(sel if variant == "nuscenes" else sel[:, :4], variant)
        out.append((body, ctype))
    return out


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def soak(name: str, env: dict, args, payloads) -> dict:
    env = {"LIDARSEG_TRIM_IDLE_S": TRIM_IDLE_S, **env}
    rest_s = float(env["LIDARSEG_TRIM_IDLE_S"]) + 1.5  # idle past the trim before RSS "at rest"
    proc, url = start_server(args.weights, args.cr, "cpu", env)
    samples: list[tuple[float, float]] = []
    statuses: collections.Counter = collections.Counter()
    lock = threading.Lock()
    running = threading.Event()  # cleared: clients finish their request and wait
    running.set()
    busy = threading.Semaphore(args.clients)
    t0 = time.monotonic()
    end = t0 + args.minutes * 60
    start_rss = rss_mb(proc.pid)

    def client(k: int):
        rng = np.random.default_rng(k)
        with httpx.Client(base_url=url, timeout=300) as c:
            while time.monotonic() < end:
                running.wait()
                with busy:
                    body, ctype = payloads[rng.integers(len(payloads))]
                    r = c.post(
                        "/v1/segment",
                        content=body,
                        headers={"Content-Type": ctype, "Accept": "application/octet-stream"},
                    )
                with lock:
                    statuses[r.status_code] += 1

    def at_rest() -> float:
        """RSS once every client is between requests and the server has been idle rest_s."""
        running.clear()
        for _ in range(args.clients):
            busy.acquire()
        time.sleep(rest_s)
        rss = rss_mb(proc.pid)
        for _ in range(args.clients):
            busy.release()
        running.set()
        return rss

    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
    for t in threads:
        t.start()
    warm_at = t0 + args.warmup * args.minutes * 60
    rest_warm = None
    while time.monotonic() < end:
        samples.append((time.monotonic() - t0, rss_mb(proc.pid)))  # under load
        if rest_warm is None and time.monotonic() >= warm_at:
            rest_warm = at_rest()
        time.sleep(1.0)
    for t in threads:
        t.join()
    final = samples[-1][1]  # the last sample under load
    time.sleep(rest_s)
    rest_end = rss_mb(proc.pid)
    proc.terminate()
    proc.wait(60)
    warm = next(r for t, r in samples if t >= warm_at - t0)
    peak = max(r for _, r in samples)
    return {
        "config": name,
        "env": env,
        "rss_start_mb": round(start_rss, 1),
        "rss_warm_mb": round(warm, 1),
        "rss_end_mb": round(final, 1),
        "rss_peak_mb": round(peak, 1),
        "rss_rest_warm_mb": round(rest_warm or warm, 1),
        "rss_rest_end_mb": round(rest_end, 1),
        "growth_after_warmup": round(rest_end / (rest_warm or warm) - 1, 4),
        "growth_under_load": round(final / warm - 1, 4),
        "statuses": dict(statuses),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--warmup", type=float, default=0.25)
    ap.add_argument("--weights", default="random")
    ap.add_argument("--cr", type=float, default=0.25)
    ap.add_argument("--config", action="append", default=[])
    args = ap.parse_args(argv)
    configs = [common.parse_config(c) for c in args.config] or [("shipped", {})]
    payloads = bodies()
    for name, env in configs:
        r = soak(name, env, args, payloads)
        print(
            f"{name:<10} RSS start {r['rss_start_mb']} MB; at rest after warm-up "
            f"{r['rss_rest_warm_mb']} MB, at rest at the end {r['rss_rest_end_mb']} MB: growth "
            f"after warm-up {100 * r['growth_after_warmup']:+.1f} %; under load "
            f"{r['rss_warm_mb']} -> {r['rss_end_mb']} MB ({100 * r['growth_under_load']:+.1f} %),"
            f" peak {r['rss_peak_mb']} MB; statuses {r['statuses']}",
            flush=True,
        )
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
