"""Peak memory of one inference request: computed from the engine's plans, measured on the CPU.

    python -m bench.memory [--points 125000 2000000] [--voxel 0.1] [--cr 0.5] [--cap-mb 256]

Each frame size runs in a fresh subprocess: the KITTI seq00 frame, tiled side by side (300 m
apart, one batch entry) up to --points points, through the whole pipeline (voxelize, maps,
network) with a random MinkUNet of width --cr. Measured: the process's peak resident memory
(ru_maxrss) during the request, minus what it held before (model, frame, libraries). Computed,
from every conv's plan: the kernel maps, the plans' gather/scatter rows, and the largest conv's
input + output + scratch (gathered inputs and partial outputs), unchunked (the whole map at
once, what the engine did before chunking) and under the cap.

Dataflows: "cuda-like" runs the grouped gather-matmul-scatter with the CUDA default grouping
(epsilon 0.3, S 65536) and the memory cap, on the CPU, so its scratch is what a GPU would
hold; "default" is the shipped CPU dataflow (fused, no scratch buffers).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys

import numpy as np
import torch

from app.inference.builder import build_pipeline
from bench import common
from kernels.engine import EngineConfig
from kernels.tuning import BUILTIN_DEFAULTS, GroupingTable

MIB = 1 << 20


def tiled_points(points: int) -> np.ndarray:
    """The KITTI frame repeated along x (300 m apart) up to `points` rows."""
    base = common.load_frame("kitti00").points
    copies = -(-points // len(base))
    tiles = []
    for i in range(copies):
        tile = base.copy()
        tile[:, 0] += 300.0 * i
        tiles.append(tile)
    return np.concatenate(tiles)[:points]


def cpu_name() -> str:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


class PlanRecorder:
    """Wraps EngineConfig.plan to keep every conv's (plan, Cin, Cout), and the maps (a plan holds
    its map weakly: they would go with the frame's tensors)."""

    def __init__(self, config: EngineConfig):
        self.convs: list[tuple] = []
        self.kmaps: dict = {}
        original = config.plan

        def plan(kmap, cin, cout, device):
            made = original(kmap, cin, cout, device)  # (plan, whether the conv runs in int8)
            self.convs.append((made[0], cin, cout))
            self.kmaps[id(kmap)] = kmap
            return made

        object.__setattr__(config, "plan", plan)

    def figures(self, config: EngineConfig) -> dict:
        kmaps = self.kmaps
        plans = {id(p): p for p, _, _ in self.convs if not p.fused}
        maps = sum((k.in_idx.numel() + k.out_idx.numel()) * 4 for k in kmaps.values())
        idx = sum(p.rows * 8 for p in plans.values())
        worst_unchunked = worst_capped = 0
        for p, cin, cout in self.convs:
            io = (p.num_in * cin + p.num_out * cout) * 4
            rows = 0 if p.fused else p.rows
            capped = min(rows, config.max_rows(cin, cout, torch.float32, torch.device("cpu")))
            worst_unchunked = max(worst_unchunked, io + rows * (cin + cout) * 4)
            worst_capped = max(worst_capped, io + capped * (cin + cout) * 4)
        entries = sum(sum(k.counts) for k in kmaps.values())
        return {
            "map_entries": entries,
            "maps_mib": maps / MIB,
            "plan_rows_mib": idx / MIB,
            "computed_unchunked_mib": (maps + idx + worst_unchunked) / MIB,
            "computed_capped_mib": (maps + idx + worst_capped) / MIB,
        }


def child(points: int, voxel: float, cr: float, cap_mb: float, dataflow: str) -> dict:
    common.set_threads(2)
    torch.manual_seed(0)
    grouping = GroupingTable.load_default()
    if dataflow == "cuda-like":
        grouping = GroupingTable(defaults={"cpu": BUILTIN_DEFAULTS["cuda"]})
    config = EngineConfig(grouping=grouping, memory_cap=int(cap_mb * MIB))
    recorder = PlanRecorder(config)
    frame = tiled_points(points)
    reach = float(np.abs(frame[:, :2]).max()) + 1.0  # keep every tile (max_xy crops at 120 m)
    pipeline = build_pipeline("random", "cpu", cr, engine=config)
    pipeline.voxel_config = dataclasses.replace(
        pipeline.voxel_config, voxel_size=voxel, max_xy=reach
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = pipeline.segment(frame)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "points": points,
        "voxels": result.num_voxels,
        "dataflow": dataflow,
        "cr": cr,
        "voxel": voxel,
        "cap_mib": cap_mb,
        "rss_before_mib": before / MIB,
        "measured_peak_mib": (after - before) / MIB,
        **recorder.figures(config),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--points", type=int, nargs="+", default=[125_000, 2_000_000])
    p.add_argument("--voxel", type=float, default=0.1)
    p.add_argument("--cr", type=float, default=0.5)
    p.add_argument("--cap-mb", type=float, default=256.0, help="the engine's scratch cap (MiB)")
    p.add_argument(
        "--dataflows", nargs="+", default=["cuda-like", "default"], choices=["cuda-like", "default"]
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        out = child(args.points[0], args.voxel, args.cr, args.cap_mb, args.dataflows[0])
        print(json.dumps(out))
        return 0
    print(
        f"# bench.memory MinkUNet cr={args.cr} voxel={args.voxel} m, cap {args.cap_mb} MiB, "
        f"torch {torch.__version__}, {cpu_name()}"
    )
    for points in args.points:
        for dataflow in args.dataflows:
            cmd = [
                sys.executable,
                "-m",
                "bench.memory",
                "--child",
                "--points",
                str(points),
                "--voxel",
                str(args.voxel),
                "--cr",
                str(args.cr),
                "--cap-mb",
                str(args.cap_mb),
                "--dataflows",
                dataflow,
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            print(
                f"{points:>9} points {r['voxels']:>8} voxels {dataflow:<9} "
                f"measured peak +{r['measured_peak_mib']:7.0f} MiB (RSS before "
                f"{r['rss_before_mib']:.0f}) | computed: maps {r['maps_mib']:.0f} MiB, "
                f"plan rows {r['plan_rows_mib']:.0f} MiB, working set "
                f"{r['computed_capped_mib']:.0f} MiB capped, "
                f"{r['computed_unchunked_mib']:.0f} MiB unchunked "
                f"({r['map_entries']} map entries)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
