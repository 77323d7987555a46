"""End-to-end MinkUNet forward, ours vs the spconv twin, on the real frames, side by side.

    python -m bench.minkunet [--frames kitti00 nuscenes ouster128] [--weights random]
                             [--cr 1.0 0.5] [--threads 1 2] [--device cpu|cuda] [--runs 3]
                             [--json OUT]

Both networks get the same voxels (our Open3D voxelizer, configured from the weights' meta by
app/inference/builder.py) and the same weights (--cr applies to --weights random); ours runs as the
service does, with BatchNorm folded into the convs (models/fold.py), the twin with its
BatchNorm layers as spconv models have them. Ours is timed
per stage (voxelize, maps, network, devoxelize); spconv builds its maps inside its forward, so
its figure is maps + network. spconv's CPU wheel is only correct single-threaded (spconv#679):
on the CPU it always runs with 1 thread, and ours is printed at every thread count asked for.
On CUDA both run in fp32 and fp16.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from app.inference.builder import build_pipeline
from app.inference.voxel_config import VoxelizeConfig
from app.inference.voxelize import voxelize
from bench import common
from app.argtypes import positive_int


def median_ms(fn, device, runs: int) -> tuple[float, object]:
    result = fn()  # warm-up
    times = []
    for _ in range(runs):
        common.sync(device)
        t0 = time.perf_counter()
        result = fn()
        common.sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), result


def bench_ours(pipeline, points, sensor, runs) -> dict:
    stages = []
    for _ in range(runs + 1):
        result = pipeline.segment(points, sensor)
        stages.append(result.timing_ms)
    stages = stages[1:]
    out = {k: statistics.median(s[k] for s in stages) for k in stages[0]}
    out["total"] = statistics.median(sum(s.values()) for s in stages)
    out["num_voxels"] = result.num_voxels
    return out


def bench_spconv(model, points, sensor, config: VoxelizeConfig, device, dtype, runs) -> dict:
    from app.inference.crosscheck import spconv_twin_of
    from models.spconv_twin import run_spconv

    twin = spconv_twin_of(model).to(dtype)
    batch = voxelize([points], config, sensor, device)
    feats = batch.feats.to(dtype)
    with torch.no_grad():
        ms, _ = median_ms(lambda: run_spconv(twin, feats, batch.coords), device, runs)
    return {"maps+network": ms}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--frames", nargs="+", default=list(common.DEFAULT_FRAMES))
    p.add_argument("--cr", type=float, nargs="+", default=[1.0, 0.5])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--weights",
        default="random",
        help="random (with --cr), default, synthetic or a checkpoint (models/weights)",
    )
    p.add_argument("--runs", type=positive_int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    dtypes = [torch.float32, torch.float16] if device.type == "cuda" else [torch.float32]
    sp_ok, why = common.spconv_available(args.device)
    print(
        f"# bench.minkunet device={device} torch={torch.__version__} runs={args.runs} "
        f"weights={args.weights}" + ("" if sp_ok else f"  (no spconv: {why})")
    )
    rows = []
    for name in args.frames:
        frame = common.load_frame(name)
        sensor = common.sensor_of(name)
        for cr in args.cr:
            for dtype in dtypes:
                dname = "fp32" if dtype == torch.float32 else "fp16"
                # fp32 arithmetic as spconv's (auto would run int8 or bf16 on a CPU that has
                # them, under this row's fp32 label)
                pipeline = build_pipeline(args.weights, device, cr, dtype=dtype, precision="fp32")
                sp = None
                if sp_ok:
                    common.set_threads(1)
                    sp = bench_spconv(
                        pipeline.model,
                        frame.points,
                        sensor,
                        pipeline.voxel_config,
                        device,
                        dtype,
                        args.runs,
                    )
                for threads in args.threads if device.type == "cpu" else [1]:
                    common.set_threads(threads)
                    ours = bench_ours(pipeline, frame.points, sensor, args.runs)
                    row = {
                        "frame": name,
                        "cr": cr,
                        "dtype": dname,
                        "threads": threads,
                        "ours_ms": ours,
                        "spconv_ms": sp,
                    }
                    rows.append(row)
                    stages = " ".join(
                        f"{k} {v:.1f}" for k, v in ours.items() if k not in ("total", "num_voxels")
                    )
                    line = (
                        f"{name:<10} cr={cr:<4} {dname} ours[{threads} thr] "
                        f"{ours['total']:8.1f} ms ({stages})"
                    )
                    if sp is not None:
                        net = ours["maps"] + ours["network"]
                        line += (
                            f" | spconv[1 thr] maps+network {sp['maps+network']:8.1f} ms |"
                            f" ours maps+network {net:.1f} ms | ours/spconv = "
                            f"{net / sp['maps+network']:.2f}x time"
                        )
                    print(line, flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"env": common.env_summary(args.device), "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
