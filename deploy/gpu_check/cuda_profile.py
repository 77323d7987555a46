"""Where a CUDA forward's time goes: torch.profiler over the pipeline on one real frame.

    PYTHONPATH=. python deploy/gpu_check/cuda_profile.py [--device cuda] [--frame kitti00]
                                                    [--weights random] [--cr 1.0] [--runs 3]

The H200 run of 2026-11-30 showed our CUDA maps and convs nearly flat in size (0.8 ms a map,
0.4 ms a conv, for 23k or 100k voxels): launches and host synchronisation, not the GPU's
arithmetic. This prints what to cut: the pipeline's stages, then the host-side CUDA calls by
count and time (cudaLaunchKernel, cudaStreamSynchronize, cudaMemcpyAsync: each device-to-host
copy waits for the GPU), then the GPU kernels by time. On a CPU it profiles the CPU only.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from app.inference.builder import build_pipeline
from bench import common


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--frame", default="kitti00")
    ap.add_argument("--weights", default="random")
    ap.add_argument("--cr", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    pipeline = build_pipeline(args.weights, device, args.cr)
    frame = common.load_frame(args.frame)
    sensor = common.sensor_of(args.frame)
    for _ in range(3):
        pipeline.segment(frame.points, sensor)
    stages = [pipeline.segment(frame.points, sensor).timing_ms for _ in range(args.runs)]
    print(f"# {args.frame} on {device}, weights {args.weights} cr {args.cr}, {args.runs} runs")
    print(
        "stages (median ms):",
        {k: round(statistics.median(s[k] for s in stages), 2) for k in stages[0]},
    )
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(args.runs):
            pipeline.segment(frame.points, sensor)
        common.sync(device)
    events = prof.key_averages()
    n = args.runs
    print(f"\n== host side, summed over the {n} runs (divide by {n} per frame), by self CPU time")
    print(events.table(sort_by="self_cpu_time_total", row_limit=30))
    if device.type == "cuda":
        print("\n== GPU kernels, by self CUDA time")
        print(events.table(sort_by="self_cuda_time_total", row_limit=25))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
