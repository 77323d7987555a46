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
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from bench import common
from kernels import backend
from kernels.engine import EngineConfig, Workspace, sparse_conv
from kernels.grouping import plan_launches
from kernels.hashtable import CoordHashTable
from kernels import KernelMap, downsample, submanifold_map
from kernels.tuning import BUILTIN_DEFAULTS, DEFAULT_PATH, GroupingTable, device_key, shape_key

EPSILONS = (0.0, 0.1, 0.2, 0.3, 0.5, 1.0)
THRESHOLDS = (0.0, 4096.0, 16384.0, 65536.0, math.inf)
# frame:voxel:keep -- real frames, subsampled, at several voxel sizes (small and large maps)
DEFAULT_MAPS = (
    "kitti00:0.05:1",
    "ouster128:0.05:1",
    "kitti00:0.05:0.5",
    "kitti00:0.2:1",
    "nuscenes:0.05:1",
    "ouster128:0.1:0.4",
)


def s_text(s: float) -> str | int:
    return "inf" if s == math.inf else int(s)


def cand_name(eps: float, s: float, dataflow: str = "grouped") -> str:
    if dataflow == "int8":
        return "int8"
    if dataflow == "fused":
        return "fused" if (eps, s) == (0.0, 0.0) else f"fused(eps={eps:g},S={s_text(s)})"
    return f"eps={eps:g},S={s_text(s)}"


def as_setting(value) -> tuple[float, float, str]:
    """(epsilon, S) or (epsilon, S, dataflow) -> (epsilon, S, dataflow)."""
    return (float(value[0]), float(value[1]), value[2] if len(value) > 2 else "grouped")


def fused_applies(device: torch.device, cin: int, cout: int, precision: str = "fp32") -> bool:
    """Whether the engine runs the fused dataflow for this shape (CPU; kernels/bf16.py for bf16)."""
    if device.type != "cpu":
        return False
    if precision == "int8":
        from kernels.bf16 import FP32_MAX_CIN
        from kernels.precision import fused_int8_lanes

        lanes = fused_int8_lanes()
        return bool(lanes) and cout % lanes == 0 and cin % 4 == 0 and cin > FP32_MAX_CIN
    if precision == "bf16":
        from kernels.bf16 import FP32_MAX_CIN
        from kernels.precision import fused_bf16_lanes

        lanes = fused_bf16_lanes()
        return bool(lanes) and cout % lanes == 0 and cin % 2 == 0 and cin > FP32_MAX_CIN
    return cout % backend.library("cpu").ls_fused_lanes_cpu() == 0


def is_key_of(key: str, device_type: str, precision: str) -> bool:
    """Whether a file entry ("cpu/k27/64x64", "cpu/bf16/k27/64x64") is this device's and
    precision's."""
    parts = key.split("/")
    if precision == "fp32":
        return parts[0] == device_type and parts[1].startswith("k")
    return parts[:2] == [device_type, precision]


def int8_candidates(table: GroupingTable, device, volume: int, cin: int, cout: int):
    """--precision int8: the int8 kernel (where it takes the shape) and the fallback precision
    with the file's setting for it, as [(representative, [members])]."""
    from kernels.precision import fallback

    other = as_setting(table.choose(device.type, volume, cin, cout, fallback("int8")))
    kernel = [((0.0, 0.0, "int8"), [(0.0, 0.0, "int8")])]
    return (kernel if fused_applies(device, cin, cout, "int8") else []) + [(other, [other])]


def entry_of(setting) -> dict:
    eps, s, dataflow = setting
    return {"epsilon": eps, "S": s_text(s), "dataflow": dataflow}


def sample_maps(specs, data, device) -> dict[int, list[tuple[str, KernelMap]]]:
    """{kernel volume: [(label, map)]}: per spec, the k3 submanifold map and the k2s2 map."""
    maps: dict[int, list[tuple[str, KernelMap]]] = {27: [], 8: []}
    for spec in specs:
        name, voxel, keep = (spec.split(":") + ["1"])[:3]
        frame = common.load_frame(name, data)
        points = common.subsample(frame.points, float(keep))
        coords = common.voxelize(points, float(voxel)).to(device)
        table = CoordHashTable.build(coords)
        label = f"{frame.name}@{voxel}m" + (f"x{keep}" if float(keep) < 1 else "")
        sub = submanifold_map(coords, table, 3)
        maps[27].append((f"{label} k3 n={len(coords)} rows={sum(sub.counts)}", sub))
        _, _, down = downsample(coords, table, 2, 2)
        maps[8].append((f"{label} k2s2 n={len(coords)}->{down.num_out}", down))
    return maps


def candidates(kmaps: list[KernelMap], epsilons, thresholds):
    """[(representative (eps, S, "grouped"), [equivalent (eps, S, "grouped")...])]: grouped
    candidates grouped by identical launches on every map, in first-seen order ((0, 0) =
    separate first)."""
    groups: dict[tuple, list[tuple[float, float, str]]] = {}
    for s in thresholds:
        for eps in epsilons:
            if s == 0 and eps != epsilons[0]:
                continue  # S = 0: every group runs unit by unit, epsilon is moot
            key = tuple(tuple(plan_launches(k, eps, s)) for k in kmaps)
            groups.setdefault(key, []).append((float(eps), float(s), "grouped"))
    return [(members[0], members) for members in groups.values()]


def measure_shape(kmaps, cin, cout, cands, device, runs, workspace, precision="fp32") -> dict:
    """Median forward time (s) summed over the maps, per representative candidate
    ((eps, S, dataflow))."""
    gen = torch.Generator().manual_seed(cin * 1000 + cout)
    volume = kmaps[0].kernel_volume
    weight = (torch.randn(volume, cin, cout, generator=gen) / math.sqrt(volume * cin)).to(device)
    feats = [torch.randn(k.num_in, cin, generator=gen).to(device) for k in kmaps]
    if precision == "int8":  # the layers int8 takes read ReLU outputs (kernels/int8.py)
        feats = [f.relu_() for f in feats]
    configs = {
        rep: EngineConfig(
            precision=precision,
            grouping=GroupingTable(entries={}, defaults={device_key(device.type, precision): rep}),
            workspace=workspace,
        )
        for rep, _ in cands
    }
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = {rep: [[] for _ in kmaps] for rep, _ in cands}
    with torch.no_grad():
        for rep, _ in cands:  # warm-up: builds and caches every plan (and its CSR)
            for f, k in zip(feats, kmaps):
                sparse_conv(f, weight, k, configs[rep])
        for _ in range(runs):
            for rep, _ in cands:
                for i, (f, k) in enumerate(zip(feats, kmaps)):
                    sync()
                    t0 = time.perf_counter()
                    sparse_conv(f, weight, k, configs[rep])
                    sync()
                    times[rep][i].append(time.perf_counter() - t0)
    return {rep: sum(statistics.median(t) for t in per_map) for rep, per_map in times.items()}


def load_existing(path: Path) -> dict:
    if path.exists():
        data = json.loads(path.read_text())
        GroupingTable.from_json(data)  # validates the format before we merge into it
        return data
    return {"version": 1, "defaults": {}, "entries": {}}


def main(argv=None) -> int:
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
    args = p.parse_args(argv)

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
    # the file's default as the engine reads it (a missing "dataflow" -> the built-in one's)
    dev_key = device_key(device.type, args.precision)
    file_table = GroupingTable.from_json(existing)  # int8's fallback settings come from it
    file_defaults = file_table.defaults
    default = as_setting(
        file_defaults.get(
            dev_key, file_defaults.get(device.type, BUILTIN_DEFAULTS.get(device.type, (0.0, 0.0)))
        )
    )
    use_fused = device.type == "cpu" and not args.no_fused and args.precision != "int8"
    if default[2] == "fused" and not use_fused:
        default = (default[0], default[1], "grouped")  # not a candidate here: its grouped form
    # One fused candidate: its offset order is the same for every (epsilon, S). It takes the
    # default's (epsilon, S) when the default is fused (so the default is a candidate as it is).
    fused = default if default[2] == "fused" else (0.0, 0.0, "fused")
    print(
        f"# bench.tuner device={device.type} threads={torch.get_num_threads()} "
        f"runs={args.runs} torch={torch.__version__} precision={args.precision}; "
        f"device default {cand_name(*default)}"
        f"; fused candidate: {use_fused}"
    )
    workspace = Workspace()
    new_entries, measured = {}, {}
    for volume in args.kernel_volumes:
        labelled = maps[volume]
        kmaps = [k for _, k in labelled]
        for label, _ in labelled:
            print(f"  map {label}")
        grouped = candidates(kmaps, args.epsilons, thresholds)
        # the grouped forms of the default and of the fused candidate (what the engine runs where
        # fused does not apply) are always measured
        for g in dict.fromkeys(
            [(default[0], default[1], "grouped"), (fused[0], fused[1], "grouped")]
        ):
            if not any(g in members for _, members in grouped):
                grouped.append((g, [g]))
        fused_cands = [(fused, [fused])] if use_fused else []
        print(
            f"  k{volume}: {len(grouped)} distinct grouped candidates of "
            f"{sum(len(m) for _, m in grouped)}" + (" + fused" if fused_cands else "")
        )
        for cin, cout in shapes:
            t0 = time.perf_counter()
            fused_here = bool(fused_cands) and fused_applies(device, cin, cout, args.precision)
            cands = grouped + (fused_cands if fused_here else [])
            if args.precision == "int8":
                cands = int8_candidates(file_table, device, volume, cin, cout)
            score = measure_shape(
                kmaps, cin, cout, cands, device, args.runs, workspace, args.precision
            )
            best = min(score, key=score.get)
            shape_default = (
                cands[0][0]  # int8: the kernel where it applies, else the fallback
                if args.precision == "int8"
                else default
                if (default[2] == "grouped" or fused_here)
                else (default[0], default[1], "grouped")
            )
            default_rep = next(rep for rep, members in cands if shape_default in members)
            chosen = best
            if score[default_rep] <= score[best] * (1 + args.margin):
                chosen = default_rep  # within the noise margin: keep the default
            # the representative for S: prefer the member that reads most plainly
            ms = {
                cand_name(*m): round(score[rep] * 1e3, 3)
                for rep, members in cands
                for m in sorted(members, key=lambda m: (m[1], m[0]))
            }
            key = shape_key(device.type, volume, cin, cout, args.precision)
            new_entries[key] = {**entry_of(chosen), "ms": ms}
            measured[key] = {m: score[rep] for rep, members in cands for m in members}
            if fused_cands and not fused_here:
                # the engine falls back to grouped with the fused setting's (eps, S): score that
                measured[key][fused] = measured[key][(fused[0], fused[1], "grouped")]
            order = sorted(score, key=score.get)
            top = ", ".join(f"{cand_name(*r)} {score[r] * 1e3:.2f}" for r in order[:3])
            sep = grouped[0][0] if args.precision != "int8" else cands[-1][0]
            extra = (
                f", fused {score[fused] * 1e3:.2f} ms = {score[fused] / score[sep]:.2f}x separate"
                if fused_here
                else (", fused n/a (Cout % lanes)" if fused_cands else "")
            )
            print(
                f"  {key:<18} -> {cand_name(*chosen):<18} "
                f"(best {cand_name(*best)} {score[best] * 1e3:.2f} ms, default "
                f"{score[default_rep] * 1e3:.2f} ms, separate "
                f"{score[sep] * 1e3:.2f} ms{extra}) [top: {top}] "
                f"{time.perf_counter() - t0:.1f}s",
                flush=True,
            )

    # device default (shapes and kernel volumes not in the file): the (epsilon, S) with the
    # lowest sum over all measured shapes of time / that shape's best time
    common_cands = set.intersection(*(set(v) for v in measured.values())) if measured else set()
    # A partial re-tune (some of this device's entries in the file left unmeasured) keeps the
    # default as it is.
    unmeasured = [
        k
        for k in existing.get("entries", {})
        if is_key_of(k, device.type, args.precision) and k not in measured
    ]
    def_rep = default
    if common_cands and not unmeasured:
        rel = {c: sum(v[c] / min(v.values()) for v in measured.values()) for c in common_cands}
        # ties: grouped before fused, then smaller S, then smaller epsilon
        best_default = min(rel, key=lambda c: (rel[c], c[2] == "fused", c[1], c[0]))
        if default not in rel or rel[default] > rel[best_default] * (1 + args.margin):
            def_rep = best_default
        if use_fused:
            wins = sum(min(v, key=v.get)[2] == "fused" for v in measured.values())
            print(
                f"# fused fastest on {wins} of {len(measured)} shapes; mean time / best time:"
                f" {cand_name(*fused)} {rel[fused] / len(measured):.3f}"
                + (
                    f", {cand_name(*def_rep)} {rel[def_rep] / len(measured):.3f}"
                    if def_rep != fused
                    else ""
                )
            )
    data = existing
    data["version"] = 1
    data.setdefault("defaults", {})
    for dev, setting in BUILTIN_DEFAULTS.items():
        data["defaults"].setdefault(dev, entry_of(as_setting(setting)))
    data["defaults"][dev_key] = entry_of(def_rep)
    data.setdefault("entries", {}).update(new_entries)
    data["entries"] = dict(sorted(data["entries"].items()))
    data.setdefault("tuned_with", {})[dev_key] = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device_name": (torch.cuda.get_device_name() if device.type == "cuda" else "cpu"),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "runs": args.runs,
        "margin": args.margin,
        "ms": "sum over the sample maps of the median forward time",
        "candidates": "grouped (eps, S)" + (" + fused" if use_fused else ""),
        "command": "python -m bench.tuner " + " ".join(argv if argv is not None else sys.argv[1:]),
        "maps": [label for v in args.kernel_volumes for label, _ in maps[v]],
    }
    GroupingTable.from_json(data)  # what the engine will load must parse
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(
        f"# default {dev_key}: {cand_name(*def_rep)}; wrote {len(new_entries)} entries to "
        f"{args.out} in {time.perf_counter() - start:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
