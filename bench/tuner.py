"""Measures the dataflow and grouping parameters (epsilon, S) per layer shape and saves the fastest.

    python -m bench.tuner [--device cpu] [--frames ...] [--channels 16 32 64 128]
                            [--pairs 32x64 64x128] [--out kernels/tuned/grouping.json]

Shapes: kernel volume 27 (k3 submanifold maps) and 8 (k2 s2 downsampling maps), Cin = Cout = C for
every C in --channels, plus the Cin x Cout pairs of --pairs (e.g. the MinkUNet-like 32x64).

Sample maps come from the real frames (tuning fits no model, so no data leaks into one), randomly
subsampled and voxelized at several voxel sizes so that small and large maps are both covered
(--maps lists them as frame:voxel:keep). Every map of a kernel volume counts: a candidate's score
is the sum over the sample maps of its median forward time (torch.no_grad, inference path with a
reused workspace, plan built in warm-up).

Candidates: the grouped dataflow (gather -> mm/bmm -> scatter) with epsilon in
{0, 0.1, 0.2, 0.3, 0.5, 1.0} x S in {0, 4096, 16384, 65536, inf}, and on the CPU the fused
dataflow (one fetch-on-demand gather-GEMM-scatter kernel, csrc/fused_cpu.cpp) as (0, 0, fused):
it walks the offsets in launch order, and that order is the same for every (epsilon, S), so one
fused candidate covers them all (--no-fused leaves it out). Fused is not measured for a shape whose
Cout is not a multiple of the kernel's vector width (the engine runs grouped there); for the
device default such a shape counts fused at the time of what the engine falls back to (grouped
with the same epsilon, S). Grouped candidates that give the same launches on every sample map
(S = 0 whatever epsilon, or S above every map's largest offset) are measured once. Runs are
interleaved (run r of every candidate before run r + 1 of any) so that a noisy machine hits all
candidates alike.

Choice: the fastest candidate, except that the device default is kept unless another candidate
beats it by more than --margin (noise guard; the default is the current default of the file or
the built-in one). Each entry records its "dataflow". The new device default is the candidate with
the lowest sum over all measured shapes of time / that shape's best time, again kept unless beaten
by more than --margin.

--precision bf16 tunes the entries the engine reads in bf16 (keyed cpu/bf16/..., kernels/tuning.py):
the grouped candidates then run torch's bf16 matmul, the fused one csrc/fused_bf16_cpu.cpp.
--precision int8 has two candidates per shape: the int8 kernel (csrc/fused_int8_cpu.cpp, "int8")
and the fallback precision (bf16 where the CPU has it natively, else fp32) with the setting the
file already holds for it (tune that precision first); the entry keeps whichever is faster.

The output follows kernels/tuning.py (version 1); this device's measured shapes are replaced, every
other entry (other devices, other shapes) is kept. The engine reads the file at start-up
(GroupingTable.load_default()).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import sys
import time
from pathlib import Path

import torch

from bench import common
from bench.tuner_candidates import EPSILONS, THRESHOLDS, cand_name, s_text
from bench.tuner_measure import (
    DEFAULT_MAPS,
    Run,
    choose_device_default,
    sample_maps,
    tune_shape,
    volume_candidates,
)
from bench.tuner_output import file_default, load_existing, write_merged
from kernels.tuning import DEFAULT_PATH, GroupingTable, device_key


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument(
        "--frames",
        nargs="+",
        default=None,
        help="frames to tune on, each at voxel 0.05 unsubsampled (overrides --maps)",
    )
    p.add_argument(
        "--maps",
        nargs="+",
        default=list(DEFAULT_MAPS),
        help="sample maps as frame:voxel:keep (default: %(default)s)",
    )
    p.add_argument("--data", type=Path, default=None, help="folder of the real frames")
    p.add_argument("--channels", type=int, nargs="+", default=[16, 32, 64, 128])
    p.add_argument("--pairs", nargs="*", default=[], help="extra Cin x Cout shapes, e.g. 32x64")
    p.add_argument("--kernel-volumes", type=int, nargs="+", default=[27, 8], choices=[27, 8])
    p.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    p.add_argument(
        "--thresholds",
        nargs="+",
        default=[s_text(s) for s in THRESHOLDS],
        help="S values ('inf' allowed)",
    )
    p.add_argument("--runs", type=int, default=5, help="timed runs per candidate and map")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads while measuring (default: torch's default)",
    )
    p.add_argument(
        "--no-fused",
        action="store_true",
        help="CPU: leave the fused dataflow out of the candidates",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=0.03,
        help="keep the device default unless beaten by more than this share",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_PATH)
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16", "int8"],
        default="fp32",
        help="CPU arithmetic the entries are for (kernels/precision.py); bf16 entries "
        "are keyed cpu/bf16/...",
    )
    return p.parse_args(argv)


def start_run(args: argparse.Namespace, device: torch.device, existing: dict) -> Run:
    """The settings every shape shares; the device default is the file's, as the engine reads it."""
    file_table = GroupingTable.from_json(existing)  # int8's fallback settings come from it
    default = file_default(file_table, device.type, device_key(device.type, args.precision))
    use_fused = device.type == "cpu" and not args.no_fused and args.precision != "int8"
    if default[2] == "fused" and not use_fused:
        default = (default[0], default[1], "grouped")  # not a candidate here: its grouped form
    return Run(device, args.precision, args.runs, args.margin, file_table, default, use_fused)


def tuned_with(args: argparse.Namespace, argv, run: Run, maps) -> dict:
    """How this run tuned, as the file records it per device and precision."""
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device_name": (torch.cuda.get_device_name() if run.device.type == "cuda" else "cpu"),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "runs": args.runs,
        "margin": args.margin,
        "ms": "sum over the sample maps of the median forward time",
        "candidates": "grouped (eps, S)" + (" + fused" if run.use_fused else ""),
        "command": "python -m bench.tuner " + " ".join(argv if argv is not None else sys.argv[1:]),
        "maps": [label for v in args.kernel_volumes for label, _ in maps[v]],
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("--device cuda but no CUDA device is available", file=sys.stderr)
        return 2
    if args.threads:
        common.set_threads(args.threads)
    thresholds = [math.inf if str(s) == "inf" else float(s) for s in args.thresholds]
    specs = [f"{f}:0.05:1" for f in args.frames] if args.frames else args.maps
    shapes = [(c, c) for c in args.channels] + [tuple(map(int, s.split("x"))) for s in args.pairs]

    start = time.perf_counter()
    maps = sample_maps(specs, args.data, device)
    existing = load_existing(args.out)
    run = start_run(args, device, existing)
    print(
        f"# bench.tuner device={device.type} threads={torch.get_num_threads()} "
        f"runs={args.runs} torch={torch.__version__} precision={args.precision}; "
        f"device default {cand_name(*run.default)}"
        f"; fused candidate: {run.use_fused}"
    )
    new_entries, measured = {}, {}
    for volume in args.kernel_volumes:
        labelled = maps[volume]
        kmaps = [k for _, k in labelled]
        for label, _ in labelled:
            print(f"  map {label}")
        grouped = volume_candidates(run, kmaps, args.epsilons, thresholds)
        print(
            f"  k{volume}: {len(grouped)} distinct grouped candidates of "
            f"{sum(len(m) for _, m in grouped)}" + (" + fused" if run.use_fused else "")
        )
        for cin, cout in shapes:
            key, entry, times = tune_shape(run, kmaps, volume, cin, cout, grouped)
            new_entries[key], measured[key] = entry, times

    def_rep = choose_device_default(run, measured, existing)
    dev_key = device_key(device.type, args.precision)
    record = tuned_with(args, argv, run, maps)
    write_merged(args.out, existing, dev_key, def_rep, new_entries, record)
    print(
        f"# default {dev_key}: {cand_name(*def_rep)}; wrote {len(new_entries)} entries to "
        f"{args.out} in {time.perf_counter() - start:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
