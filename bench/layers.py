"""Layer benchmark on real LiDAR frames: ours vs spconv 2.x, side by side in one run.

    python -m bench.layers [--frames kitti00 nuscenes ...] [--voxel 0.05] [--threads 1 2]
                           [--device cpu|cuda] [--channels 32 64 128] [--json OUT]

Per frame (voxelized at --voxel, batch 0) and per thread count (CPU) it prints:
 (a) map building for a k3 submanifold conv.
     ours   = submanifold_map(coords, k=3), what CoordinateManager does once per level: on the
              CPU merge joins over the sorted rows (the frame's voxels come sorted, as the
              service's voxelizer gives them) with no voxel hash table; on CUDA the table build
              + look-ups. A second line, "shuffled", times both sides on the same voxels in a
              random row order (the CPU takes its 4x4x4 block path there). The execution plan
              that the first forward builds from the map for the tuned (epsilon, S, dataflow) of
              a 64x64 layer (build_plan; on CUDA also the scatter CSR the deterministic mode
              uses; for the fused dataflow its offset order) is shown separately as "+plan".
     spconv = the indice-pair generation a SubMConv3d(k=3) forward runs on a fresh
              SparseConvTensor, called directly with the layer's own algorithm: on CPU
              ops.get_indice_pairs (ConvAlgo.Native, the only CPU algorithm), on CUDA
              ops.get_indice_pairs_implicit_gemm (the default MaskImplicitGemm, is_train=False,
              as in inference). The conv itself is not included on either side.
 (b) SubMConv3d forward, maps reused, torch.no_grad(), Cin = Cout = C: ours (sparse_conv with the
     default EngineConfig, i.e. the tuned dataflow and grouping, shown in brackets) vs spconv
     (SubMConv3d with an indice_key whose pairs are already in the tensor's indice_dict).
     "maxdiff" compares spconv with ours (same weights via weight_from_spconv).
 (c) achieved GFLOP/s of ours = 2 * (map entries incl. centre) * Cin * Cout / time, against one
     dense torch.mm [entries, Cin] @ [Cin, Cout] (same FLOPs: the practical limit), and the
     fraction of it we reach.
 (d) dataflow and grouping: ours with the tuned (epsilon, S, dataflow) vs the grouped dataflow
     (gather -> mm/bmm -> scatter) separate (S=0) and dense (epsilon=1, S=inf), and on CPU vs the
     fused dataflow (one fetch-on-demand gather-GEMM-scatter kernel, csrc/fused_cpu.cpp;
     fp32 and Cout a multiple of the vector width, grouped otherwise).
 (e) deterministic mode: EngineConfig(deterministic=True) vs default. CPU: no float atomics in
     either dataflow (fused kernel and per-offset scatter are race-free by construction), so
     deterministic mode is the default path: zero cost, nothing to measure. On CUDA the default
     scatter uses float atomics and deterministic mode an ordered (CSR) scatter: measured.
On CUDA also fp16 for ours and spconv. spconv needs non-negative coordinates: its copy of the
coordinates is shifted by a per-axis multiple of 8 (bench/common.py).

spconv's CPU path is only correct single-threaded (spconv issue #679): with more than one thread
its figures are timings of a computation that gives wrong results (see maxdiff).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path

import torch

from kernels import submanifold_map
from kernels.engine import EngineConfig
from kernels.grouping import build_plan

from . import common, layers_spconv
from .layers_conv import ConvFigures, fmt_s, ratio_text, setting_text
from app.argtypes import positive_int


class Bench:
    """One bench.layers run: (a) here, (b)-(e) through bench/layers_conv.py, per frame and thread
    count; t() times a call with the run's --warmup, --runs and --budget, out() prints a line."""

    def __init__(self, args):
        self.args = args
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.sp_ok, self.sp_why = common.spconv_available(args.device)

    def out(self, line: str = "") -> None:
        print(line, flush=True)

    def t(self, fn):
        return common.time_fn(
            fn, self.device, warmup=self.args.warmup, runs=self.args.runs, budget_s=self.args.budget
        )[0]

    # (a) ----------------------------------------------------------------
    def _map_times(self, coords, sp_coords, spatial):
        """(ours, spconv or None) seconds to build the k3 submanifold map of these rows."""
        ours = self.t(lambda: submanifold_map(coords, None, 3))
        sp = self.t(layers_spconv.pairs_fn(sp_coords, spatial)) if self.sp_ok else None
        return ours, sp

    def maps(self, coords, sp_coords, spatial, threads_label):
        """(a): the k3 submanifold map and its plan, ours vs spconv, then on shuffled rows;
        (the map, its figures)."""
        res = {}
        ours, sp = self._map_times(coords, sp_coords, spatial)
        kmap = submanifold_map(coords, None, 3)
        eps, thr, dataflow = EngineConfig().grouping.choose(self.device.type, 27, 64, 64)
        fused = dataflow == "fused"

        def plan_once():
            fresh = dataclasses.replace(kmap, plans={})  # held here: a plan holds it weakly
            p = build_plan(fresh, eps, thr, fused=fused)
            if self.cuda:
                _ = p.scatter_csr  # the deterministic scatter's CSR
            elif fused:
                _ = (p.kernel_order, p.bounds)  # what the fused kernel walks
            return p

        plan = self.t(plan_once)
        res.update(
            ours_ms=ours * 1e3,
            ours_plan_ms=plan * 1e3,
            plan_for={"epsilon": eps, "S": fmt_s(thr), "dataflow": dataflow},
        )
        line = (
            f"  (a) map k3   ours {ours * 1e3:8.2f} ms (+plan {plan * 1e3:.2f} ms,"
            f" {setting_text(eps, thr, dataflow)})"
        )
        if sp is not None:
            res["spconv_ms"] = sp * 1e3
            res["ratio"] = ours / sp
            res["ratio_with_plan"] = (ours + plan) / sp
            line += (
                f" | spconv {sp * 1e3:8.2f} ms{threads_label} | {ratio_text(ours, sp)};"
                f" with plan {ratio_text(ours + plan, sp)}"
            )
        self.out(line)
        # The same voxels in a random row order (scan order, say): not the sorted fast path.
        perm = torch.randperm(len(coords), generator=torch.Generator().manual_seed(0))
        ours_shuffled, sp = self._map_times(
            coords[perm.to(coords.device)].contiguous(),
            sp_coords[perm.to(sp_coords.device)].contiguous(),
            spatial,
        )
        res["shuffled_ours_ms"] = ours_shuffled * 1e3
        line = f"      shuffled ours {ours_shuffled * 1e3:8.2f} ms"
        if sp is not None:
            res.update(shuffled_spconv_ms=sp * 1e3, shuffled_ratio=ours_shuffled / sp)
            line += f" | spconv {sp * 1e3:8.2f} ms{threads_label} | {ratio_text(ours_shuffled, sp)}"
        self.out(line)
        return kmap, res

    def run(self) -> dict:
        args = self.args
        result = {
            "env": common.env_summary(args.device),
            "voxel": args.voxel,
            "threads": args.threads,
            "frames": [],
        }
        result["env"]["grouping_file"] = str(
            Path(__file__).resolve().parents[1] / "kernels" / "tuned" / "grouping.json"
        )
        if not self.sp_ok:
            self.out(f"NOTE: no spconv comparison ({self.sp_why})")
        self.out(
            f"# bench.layers  device={args.device} voxel={args.voxel} "
            f"torch={torch.__version__} spconv={result['env']['spconv']}"
            f"  runs={args.runs} (median) warmup={args.warmup}"
        )
        if not self.cuda:
            self.out(
                "# spconv CPU is only correct with 1 thread (spconv issue #679): its"
                " >1-thread figures are timings only"
            )
        for name in args.frames:
            result["frames"].append(self.frame(name))
        return result

    def frame(self, name: str) -> dict:
        """(a)-(e) on one frame, at every thread count (CPU; CUDA: once)."""
        args = self.args
        frame = common.load_frame(name, args.data)
        coords = common.voxelize(frame.points, args.voxel)
        sp_coords, spatial = common.spconv_coords(coords)
        coords, sp_coords = coords.to(self.device), sp_coords.to(self.device)
        runs: list[dict] = []
        fres = {
            "frame": frame.name,
            "points": len(frame.points),
            "voxels": len(coords),
            "spatial_shape": spatial,
            "runs": runs,
        }
        self.out(
            f"\n== {frame.name}: {len(frame.points)} points -> {len(coords)} voxels"
            f" at {args.voxel} m"
        )
        thread_list = args.threads if not self.cuda else [args.threads[0]]
        for threads in thread_list:
            if not self.cuda:
                common.set_threads(threads)
            label = f"threads={threads}" if not self.cuda else "cuda"
            wrong = not self.cuda and threads > 1
            self.out(
                f" -- {label}"
                + (" (spconv: incorrect results, timing only)" if wrong and self.sp_ok else "")
            )
            kmap, maps = self.maps(coords, sp_coords, spatial, " [timing only]" if wrong else "")
            self.out(
                f"      map entries incl. centre: {sum(kmap.counts)}"
                f" ({sum(kmap.counts) / len(coords):.2f} per voxel)"
            )
            convs = ConvFigures(self, kmap, len(coords), sp_coords, spatial, threads).rows()
            runs.append({"threads": threads if not self.cuda else None, "map": maps, "conv": convs})
        return fres


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--frames",
        nargs="+",
        default=list(common.DEFAULT_FRAMES),
        help=f"short names {sorted(common.FRAMES)} or paths (default: %(default)s)",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help=f"folder of the real frames (default: {common.DEFAULT_DATA})",
    )
    p.add_argument("--voxel", type=float, default=0.05)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--channels", type=int, nargs="+", default=[32, 64, 128])
    p.add_argument("--runs", type=positive_int, default=5, help="timed runs per figure (median)")
    p.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="untimed runs first (the first calls of a process run slower)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=1.5,
        help="stop timing a figure after this many seconds (>= 3 runs)",
    )
    p.add_argument("--json", type=Path, default=None, help="write all figures to this file")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    result = Bench(args).run()
    result["wall_s"] = time.perf_counter() - start
    print(f"\n# done in {result['wall_s']:.1f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
        print(f"# figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
