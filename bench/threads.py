"""Throughput with one core stolen: the thread settings before (torch's defaults, OpenMP
spinning) and now (app/threads.py: LIDARSEG_THREADS, passive OpenMP), side by side in one run.

    python -m bench.threads [--frame nuscenes] [--runs 6] [--weights random --cr 0.25]

A busy-loop process pinned to CPU 0 plays the noisy neighbour (issue 15: throughput fell 12x with
one of two cores taken). Each setting runs in a fresh process (OpenMP reads its variables when
libgomp loads): the in-process pipeline segments the frame --runs times after a warm-up; frames
per second are printed for each setting, with and without the neighbour, and the ratios to
"before". Settings: before (no OMP variables: torch's thread count, libgomp's default spin),
default (configure_env(): threads = cgroup quota else CPUs, OMP_WAIT_POLICY=passive with a short
spin, app/threads.py), spin=0 (the default but sleeping at once), threads=1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench import common

_WORKER = r"""
import json, os, sys, time
mode, frame_name, weights = sys.argv[1], sys.argv[2], sys.argv[4]
runs, cr = int(sys.argv[3]), float(sys.argv[5])
if mode != "before":
    from app.threads import configure_env
    configure_env()
import numpy as np, torch
from bench import common
from app.inference.builder import build_pipeline
pipe = build_pipeline(weights, "cpu", cr)
frame = common.load_frame(frame_name).points
sensor = "nuscenes" if frame.shape[1] == 5 else "kitti"
pipe.segment(np.array(frame), sensor)
t0 = time.perf_counter()
for _ in range(runs):
    pipe.segment(np.array(frame), sensor)
print(json.dumps({"fps": runs / (time.perf_counter() - t0), "threads": torch.get_num_threads()}))
"""

_HOG = "import os\nos.sched_setaffinity(0, {0})\nwhile True:\n    pass\n"

SETTINGS = {
    "before": {},
    "default": {},
    "spin=0": {"GOMP_SPINCOUNT": "0"},
    "threads=1": {"LIDARSEG_THREADS": "1"},
}
OMP_VARS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "LIDARSEG_THREADS")


def measure(mode: str, args) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    env.update(SETTINGS[mode])
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _WORKER,
            "before" if mode == "before" else mode,
            args.frame,
            str(args.runs),
            args.weights,
            str(args.cr),
        ],
        cwd=common.REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if out.returncode:
        raise SystemExit(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--frame", default="nuscenes")
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--weights", default="random")
    ap.add_argument("--cr", type=float, default=0.25)
    args = ap.parse_args(argv)
    results = {}
    for stolen in (False, True):
        hog = subprocess.Popen([sys.executable, "-c", _HOG]) if stolen else None
        try:
            time.sleep(0.5 if stolen else 0)
            for mode in SETTINGS:
                results[(stolen, mode)] = measure(mode, args)
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
    print(
        f"{'setting':<10} {'threads':>7} {'fps, free':>10} {'fps, 1 core stolen':>19} "
        f"{'vs before (stolen)':>19}"
    )
    base = results[(True, "before")]["fps"]
    for mode in SETTINGS:
        free, busy = results[(False, mode)], results[(True, mode)]
        print(
            f"{mode:<10} {busy['threads']:>7} {free['fps']:>10.2f} {busy['fps']:>19.2f} "
            f"{busy['fps'] / base:>18.2f}x"
        )
    print(json.dumps({f"{'stolen' if s else 'free'}/{m}": r for (s, m), r in results.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
