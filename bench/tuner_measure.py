"""What bench/tuner.py measures and how it chooses: the sample maps from the real frames, each
candidate's forward time on them per layer shape, the choice per shape (the device default kept
unless beaten by more than the margin) and the choice of the device default across shapes.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

import torch

from bench import common
from bench.tuner_candidates import (
    Setting,
    cand_name,
    entry_of,
    fused_applies,
    grouped_candidates,
    int8_candidates,
)
from bench.tuner_output import is_key_of
from kernels import KernelMap, downsample, submanifold_map
from kernels.engine import EngineConfig, Workspace, sparse_conv
from kernels.hashtable import CoordHashTable
from kernels.tuning import GroupingTable, device_key, shape_key

# frame:voxel:keep -- real frames, subsampled, at several voxel sizes (small and large maps)
DEFAULT_MAPS = (
    "kitti00:0.05:1",
    "ouster128:0.05:1",
    "kitti00:0.05:0.5",
    "kitti00:0.2:1",
    "nuscenes:0.05:1",
    "ouster128:0.1:0.4",
)


@dataclasses.dataclass
class Run:
    """What every layer shape of one tuner run shares."""

    device: torch.device
    precision: str
    runs: int  # timed runs per candidate and map
    margin: float  # the default is kept unless another candidate beats it by more than this share
    file_table: GroupingTable  # the output file as it stood (int8's fallback settings)
    default: Setting  # the device default, as it is a candidate here
    use_fused: bool  # whether the fused dataflow is a candidate
    workspace: Workspace = dataclasses.field(default_factory=Workspace)

    @property
    def fused(self) -> Setting:
        """The one fused candidate: its offset order is the same for every (epsilon, S). It takes
        the default's (epsilon, S) when the default is fused (so the default is a candidate as
        it is)."""
        return self.default if self.default[2] == "fused" else (0.0, 0.0, "fused")


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


def volume_candidates(run: Run, kmaps: list[KernelMap], epsilons, thresholds):
    """The grouped candidates of one kernel volume's maps, as [(representative, [members])]."""
    grouped = grouped_candidates(kmaps, epsilons, thresholds)
    # the grouped forms of the default and of the fused candidate (what the engine runs where
    # fused does not apply) are always measured
    default, fused = run.default, run.fused
    for g in dict.fromkeys([(default[0], default[1], "grouped"), (fused[0], fused[1], "grouped")]):
        if not any(g in members for _, members in grouped):
            grouped.append((g, [g]))
    return grouped


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
    times: dict[Setting, list[list[float]]] = {rep: [[] for _ in kmaps] for rep, _ in cands}
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


def tune_shape(run: Run, kmaps, volume: int, cin: int, cout: int, grouped):
    """Measures one layer shape's candidates, chooses and prints the choice:
    (file key, entry, {setting: time (s)} for every candidate setting)."""
    t0 = time.perf_counter()
    device, precision, default, fused = run.device, run.precision, run.default, run.fused
    fused_here = run.use_fused and fused_applies(device, cin, cout, precision)
    cands = grouped + ([(fused, [fused])] if fused_here else [])
    if precision == "int8":
        cands = int8_candidates(run.file_table, device, volume, cin, cout)
    score = measure_shape(kmaps, cin, cout, cands, device, run.runs, run.workspace, precision)
    best = min(score, key=score.__getitem__)
    shape_default = (
        cands[0][0]  # int8: the kernel where it applies, else the fallback
        if precision == "int8"
        else default
        if (default[2] == "grouped" or fused_here)
        else (default[0], default[1], "grouped")
    )
    default_rep = next(rep for rep, members in cands if shape_default in members)
    chosen = best
    if score[default_rep] <= score[best] * (1 + run.margin):
        chosen = default_rep  # within the noise margin: keep the default
    # the representative for S: prefer the member that reads most plainly
    ms = {
        cand_name(*m): round(score[rep] * 1e3, 3)
        for rep, members in cands
        for m in sorted(members, key=lambda m: (m[1], m[0]))
    }
    key = shape_key(device.type, volume, cin, cout, precision)
    measured = {m: score[rep] for rep, members in cands for m in members}
    if run.use_fused and not fused_here:
        # the engine falls back to grouped with the fused setting's (eps, S): score that
        measured[fused] = measured[(fused[0], fused[1], "grouped")]
    separate = grouped[0][0] if precision != "int8" else cands[-1][0]
    line = shape_line(run, key, score, chosen, best, default_rep, separate, fused_here)
    print(f"{line} {time.perf_counter() - t0:.1f}s", flush=True)
    return key, {**entry_of(chosen), "ms": ms}, measured


def shape_line(run: Run, key, score, chosen, best, default_rep, separate, fused_here) -> str:
    """One shape's choice as the tuner prints it (times in ms)."""
    fused = run.fused
    order = sorted(score, key=score.get)
    top = ", ".join(f"{cand_name(*r)} {score[r] * 1e3:.2f}" for r in order[:3])
    extra = (
        f", fused {score[fused] * 1e3:.2f} ms = {score[fused] / score[separate]:.2f}x separate"
        if fused_here
        else (", fused n/a (Cout % lanes)" if run.use_fused else "")
    )
    return (
        f"  {key:<18} -> {cand_name(*chosen):<18} "
        f"(best {cand_name(*best)} {score[best] * 1e3:.2f} ms, default "
        f"{score[default_rep] * 1e3:.2f} ms, separate "
        f"{score[separate] * 1e3:.2f} ms{extra}) [top: {top}]"
    )


def choose_device_default(run: Run, measured: dict, existing: dict) -> Setting:
    """The device default (shapes and kernel volumes not in the file): the setting with the
    lowest sum over all measured shapes of time / that shape's best time, unless the run left
    some of this device's entries in the file unmeasured (a partial re-tune keeps the default)."""
    common_cands = set.intersection(*(set(v) for v in measured.values())) if measured else set()
    unmeasured = [
        k
        for k in existing.get("entries", {})
        if is_key_of(k, run.device.type, run.precision) and k not in measured
    ]
    default, fused = run.default, run.fused
    def_rep = default
    if common_cands and not unmeasured:
        rel = {c: sum(v[c] / min(v.values()) for v in measured.values()) for c in common_cands}
        # ties: grouped before fused, then smaller S, then smaller epsilon
        best_default = min(rel, key=lambda c: (rel[c], c[2] == "fused", c[1], c[0]))
        if default not in rel or rel[default] > rel[best_default] * (1 + run.margin):
            def_rep = best_default
        if run.use_fused:
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
    return def_rep
