"""The voxelize stage against its floor, side by side in one run, on real frames.

    python -m bench.voxelize [--frames kitti00 nuscenes ouster128] [--runs 15] [--threads N]

Per frame, alternately: app.inference.voxelize.voxelize (the kernel pass for validity, keys and
runs; Open3D's hash set; the kernel ordering the distinct keys; the kernel pass for the mean
features; every point's voxel) and the floor, a plain numpy
sort-unique of the same packed 64-bit keys (np.unique(keys, return_inverse=True): the distinct
voxels in order and every point's voxel, nothing else). Prints both medians with their spread
(min..max), wall and process CPU time, and the ratio voxelize / floor as the median of the
per-run ratios with its spread. The CPU-time ratio is the steadier one on a shared machine.
Both run under the server's process settings (app/threads.py, app/heap.py, gc.freeze() after the
warm-up), as bench.service's in-process pipeline does: glibc's heap reuses the buffers of one
call in the next, as it does in the service's stream of frames.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

from app.heap import configure_malloc
from app.threads import configure_env

# before torch loads libgomp and before any thread starts, as `python -m app` does
configure_env()
configure_malloc()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from app.inference.voxel_config import VoxelizeConfig  # noqa: E402
from app.inference.voxelize import voxelize  # noqa: E402
from bench import common  # noqa: E402


def packed_keys(points: np.ndarray, voxel: float) -> np.ndarray:
    """(batch 0, x, y, z) grid cells shifted to 0, packed in 64 bits, as voxelize packs them."""
    grid = np.floor(points[:, :3] / np.float32(voxel)).astype(np.int32)
    shifted = (grid - grid.min(axis=0)).astype(np.int64)
    return (shifted[:, 0] << 17 | shifted[:, 1]) << 17 | shifted[:, 2]


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} [{min(values):.3g}..{max(values):.3g}]"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--frames", nargs="+", default=list(common.DEFAULT_FRAMES))
    # the default model's voxel size first
    p.add_argument("--voxel", type=float, nargs="+", default=[0.1, 0.05])
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--data", default=None)
    p.add_argument("--json", default=None, help="write each frame's median ratios here")
    args = p.parse_args(argv)
    if args.threads:
        common.set_threads(args.threads)
    print(
        f"# bench.voxelize runs={args.runs} threads={torch.get_num_threads()} "
        f"voxel={args.voxel} numpy={np.__version__}"
    )
    rows = [compare(name, voxel, args) for voxel in args.voxel for name in args.frames]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def compare(name: str, voxel: float, args) -> dict:
    """Prints voxelize against the floor for one frame at one voxel size; its medians."""
    config = VoxelizeConfig(voxel_size=voxel)
    points = common.load_frame(name, args.data).points
    sensor = common.sensor_of(name)
    keys = packed_keys(points[np.isfinite(points[:, :3]).all(axis=1)], voxel)
    fns = {
        "voxelize": lambda: voxelize([points], config, sensor),
        "floor": lambda: np.unique(keys, return_inverse=True),
    }
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    for fn in fns.values():
        fn()  # warm-up
    gc.freeze()  # as the server does after its warm-up (app/service/main.py)
    for _ in range(args.runs):
        for k, fn in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[k].append((time.perf_counter() - t0) * 1e3)
            cpu[k].append((time.process_time() - c0) * 1e3)
    ratio = [a / b for a, b in zip(wall["voxelize"], wall["floor"])]
    cpu_ratio = [a / b for a, b in zip(cpu["voxelize"], cpu["floor"])]
    print(
        f"{name} at {voxel} m: {len(points)} points -> {len(np.unique(keys))} voxels\n"
        f"  voxelize {spread(wall['voxelize'])} ms (CPU {spread(cpu['voxelize'])} ms)\n"
        f"  floor    {spread(wall['floor'])} ms (CPU {spread(cpu['floor'])} ms)\n"
        f"  voxelize / floor: x{spread(ratio)} wall, x{spread(cpu_ratio)} CPU",
        flush=True,
    )
    return {
        "frame": name,
        "voxel": voxel,
        "ratio": statistics.median(ratio),
        "cpu_ratio": statistics.median(cpu_ratio),
        "voxelize_ms": statistics.median(wall["voxelize"]),
        "floor_ms": statistics.median(wall["floor"]),
    }


if __name__ == "__main__":
    raise SystemExit(main())
