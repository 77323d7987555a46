"""What building every map in the maps stage saves per request, side by side.

    python -m bench.maps_stage [--frame kitti00] [--weights default] [--runs 9] [--device cpu]

"now": the maps stage builds every map the network uses (MinkUNet.map_requests: the kernel-3
and 1x1 submanifold maps, the downsamplings and their transposed upsampling maps), a 1x1 map
being the identity with no look-up. "before" (as up to c09a502): the maps stage built only the
kernel-3 and downsampling maps; at network time each level's first 1x1 conv built that level's
hash table and looked up zero offsets, and each upsampling transposed its map. Both run the same
model on the same frame, interleaved run by run; the labels must be identical. Besides the
stages' wall time it prints the process CPU time per request, the steadier figure on a shared
machine (it leaves out what the OS gives other processes).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import numpy as np
import torch

import kernels.kmap as kmap
import models.sparse_tensor as sparse_tensor
from app.inference.builder import build_pipeline
from app.inference.pipeline import SegmentationPipeline
from bench import common
from kernels.hashtable import CoordHashTable
from app.argtypes import positive_int


def _before_submanifold_map(coords, table=None, kernel_size=3, dilation=1):
    """The 1x1 path as it was: a hash table of the level, then a look-up of zero offsets."""
    if kernel_size != 1:
        return kmap.submanifold_map(coords, table, kernel_size, dilation)
    table = table if table is not None else CoordHashTable.build(coords)
    nbr, counts = table.lookup(coords, 1, kmap.kernel_offsets(1, 0, dilation)[:0])
    in_idx, out_idx, half = kmap._compact(nbr, counts)
    return kmap._symmetric_map(in_idx, out_idx, half, 1, coords.shape[0])


def _before_needs_table(device, kernel_size, dilation=1):
    return not (torch.device(device).type == "cpu" and kernel_size == 3 and dilation == 1)


@contextlib.contextmanager
def before():
    saved = sparse_tensor.submanifold_map, sparse_tensor.submanifold_needs_table
    sparse_tensor.submanifold_map = _before_submanifold_map
    sparse_tensor.submanifold_needs_table = _before_needs_table
    try:
        yield
    finally:
        sparse_tensor.submanifold_map, sparse_tensor.submanifold_needs_table = saved


class BeforePipeline(SegmentationPipeline):
    def map_requests(self) -> tuple:
        return tuple(
            r
            for r in super().map_requests()
            if r.kind == "downsample" or (r.kind == "submanifold" and r.kernel_size == 3)
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--frame", default="kitti00")
    ap.add_argument("--weights", default="default")
    ap.add_argument("--cr", type=float, default=1.0, help="channel ratio of --weights random")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--runs", type=positive_int, default=9)
    args = ap.parse_args(argv)
    now = build_pipeline(args.weights, args.device, args.cr)
    old = BeforePipeline(now.model, now.voxel_config, args.device, meta=now.meta)
    points = np.ascontiguousarray(common.load_frame(args.frame).points)
    sensor = common.sensor_of(args.frame)
    keys = ("maps", "network", "maps+network", "total", "cpu")
    times: dict[str, dict[str, list[float]]] = {
        "before": {k: [] for k in keys},
        "now": {k: [] for k in keys},
    }
    reference = None
    for run in range(args.runs + 1):  # the first run of each warms up
        for name, pipeline, ctx in (("before", old, before), ("now", now, contextlib.nullcontext)):
            with ctx():
                c0 = time.process_time()
                result = pipeline.segment(points, sensor)
                cpu_ms = (time.process_time() - c0) * 1e3
            t = result.timing_ms
            if run == 0:  # warm-up; both give the same labels
                reference = result.labels if reference is None else reference
                assert np.array_equal(reference, result.labels), name
                continue
            for k, v in (
                ("maps", t["maps"]),
                ("network", t["network"]),
                ("maps+network", t["maps"] + t["network"]),
                ("total", sum(t.values())),
                ("cpu", cpu_ms),
            ):
                times[name][k].append(v)
    med = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in times.items()}
    print(
        f"# bench.maps_stage frame={args.frame} points={len(points)} voxels="
        f"{result.num_voxels} weights={args.weights} device={args.device} "
        f"threads={torch.get_num_threads()} median of {args.runs} interleaved runs (ms)"
    )
    print(f"{'':<14}{'before':>10}{'now':>10}{'saved':>10}{'ratio':>8}   (cpu: process CPU ms)")
    for k in keys:
        b, n = med["before"][k], med["now"][k]
        print(f"{k:<14}{b:>10.1f}{n:>10.1f}{b - n:>10.1f}{b / n:>8.3f}")
    removed_work(now, points, sensor, args.runs)
    return 0


def removed_work(pipeline, points, sensor: str, runs: int) -> None:
    """The work the change removes, timed alone (the transposed maps only moved from the network
    stage to the maps stage): each level's 1x1 map, before (a hash table of the level and a
    look-up of zero offsets) and now (the identity, no look-up), interleaved."""
    from app.inference.voxelize import voxelize
    from models import SparseTensor

    batch = voxelize([points], pipeline.voxel_config, sensor, pipeline.device)
    x = SparseTensor(batch.feats, batch.coords, engine=pipeline.engine)
    x.manager.prepare(pipeline.map_requests())
    levels = sorted(
        {
            r.stride
            for r in pipeline.map_requests()
            if r.kind == "submanifold" and r.kernel_size == 1
        }
    )
    coords = [x.manager.coords(s) for s in levels]
    times: dict[str, list[float]] = {"before": [], "now": []}
    for _ in range(max(runs, 10) * 3):
        for name, build in (("before", _before_submanifold_map), ("now", kmap.submanifold_map)):
            t0 = time.perf_counter()
            for c in coords:
                build(c, None, 1, 1)
            times[name].append((time.perf_counter() - t0) * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"1x1 maps of levels {levels} ({[len(c) for c in coords]} voxels) per request: before "
        f"{med['before']:.2f} ms (min {min(times['before']):.2f}), now {med['now']:.3f} ms "
        f"(min {min(times['now']):.3f}): {med['before'] - med['now']:.2f} ms saved"
    )


if __name__ == "__main__":
    raise SystemExit(main())
