"""Per-stage latency of several weights on one frame, measured side by side in one process.

    python -m train.latency [--weights default synthetic] [--frame F.bin] [--runs 7]

Each model gets a warm-up run, then the models take turns (run i of every model, then run i + 1)
so a change in machine load hits them alike. Prints one JSON object: per weights, the median and
min of each stage (voxelize, maps, network, devoxelize) in ms, and the ratio of the medians of
the network stage to the first weights'.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from app.codecs.files import read_frame
from app.inference.builder import build_pipeline

from .real import REAL_DIR
from app.argtypes import positive_int


def measure(weights: list[str], frame: str, runs: int) -> dict:
    points, sensor = read_frame(frame, "kitti")
    pipelines = {}
    for w in weights:
        pipelines[w] = build_pipeline(w, "cpu")
        pipelines[w].segment(points, sensor)  # warm-up
    times: dict[str, list[dict]] = {w: [] for w in weights}
    for _ in range(runs):
        for w, pipeline in pipelines.items():
            times[w].append(pipeline.segment(points, sensor).timing_ms)
    out = {}
    for w, runs_ms in times.items():
        stages = runs_ms[0].keys()
        out[w] = {
            s: {
                "median_ms": float(np.median([r[s] for r in runs_ms])),
                "min_ms": float(np.min([r[s] for r in runs_ms])),
            }
            for s in stages
        }
    base = out[weights[0]]["network"]["median_ms"]
    for w in weights:
        out[w]["network_ratio_to_first"] = out[w]["network"]["median_ms"] / base
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m train.latency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--weights", nargs="+", default=["default", "synthetic"])
    ap.add_argument("--frame", default=str(REAL_DIR / "seq00_000000.bin"))
    ap.add_argument("--runs", type=positive_int, default=7)
    a = ap.parse_args(argv)
    print(
        json.dumps(
            {"frame": a.frame, "runs": a.runs, "stages": measure(a.weights, a.frame, a.runs)},
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
