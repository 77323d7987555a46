"""The settings bench/tuner.py chooses among: candidate (epsilon, S, dataflow) per layer shape, how
they read in its output and in kernels/tuned/*, and where each applies.

A setting is (epsilon, S, dataflow), dataflow "grouped", "fused" or "int8" (kernels/tuning.py).
Candidates come as [(representative, [members])]: settings that give the same launches on every
sample map are measured once, through their representative, and every member gets its time.
"""

from __future__ import annotations

import math

import torch

from kernels import KernelMap, backend
from kernels.grouping import plan_launches
from kernels.tuning import GroupingTable

EPSILONS = (0.0, 0.1, 0.2, 0.3, 0.5, 1.0)
THRESHOLDS = (0.0, 4096.0, 16384.0, 65536.0, math.inf)

Setting = tuple[float, float, str]  # (epsilon, S, dataflow)


def s_text(s: float) -> str | int:
    return "inf" if s == math.inf else int(s)


def cand_name(eps: float, s: float, dataflow: str = "grouped") -> str:
    if dataflow == "int8":
        return "int8"
    if dataflow == "fused":
        return "fused" if (eps, s) == (0.0, 0.0) else f"fused(eps={eps:g},S={s_text(s)})"
    return f"eps={eps:g},S={s_text(s)}"


def as_setting(value) -> Setting:
    """(epsilon, S) or (epsilon, S, dataflow) -> (epsilon, S, dataflow)."""
    return (float(value[0]), float(value[1]), value[2] if len(value) > 2 else "grouped")


def entry_of(setting) -> dict:
    eps, s, dataflow = setting
    return {"epsilon": eps, "S": s_text(s), "dataflow": dataflow}


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


def grouped_candidates(kmaps: list[KernelMap], epsilons, thresholds):
    """[(representative (eps, S, "grouped"), [equivalent (eps, S, "grouped")...])]: grouped
    candidates grouped by identical launches on every map, in first-seen order ((0, 0) =
    separate first)."""
    groups: dict[tuple, list[Setting]] = {}
    for s in thresholds:
        for eps in epsilons:
            if s == 0 and eps != epsilons[0]:
                continue  # S = 0: every group runs unit by unit, epsilon is moot
            key = tuple(tuple(plan_launches(k, eps, s)) for k in kmaps)
            groups.setdefault(key, []).append((float(eps), float(s), "grouped"))
    return [(members[0], members) for members in groups.values()]


def int8_candidates(table: GroupingTable, device, volume: int, cin: int, cout: int):
    """--precision int8: the int8 kernel (where it takes the shape) and the fallback precision
    with the file's setting for it, as [(representative, [members])]."""
    from kernels.precision import fallback

    other = as_setting(table.choose(device.type, volume, cin, cout, fallback("int8")))
    kernel = [((0.0, 0.0, "int8"), [(0.0, 0.0, "int8")])]
    return (kernel if fused_applies(device, cin, cout, "int8") else []) + [(other, [other])]
