"""kernels/grouping.py's plan against hand-worked launches: the redundancy ratio's value, a group
whose redundancy equals epsilon exactly, a group whose largest map equals S (not below it), empty
offsets, and the plan cache keyed by both epsilon and S."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.grouping import build_plan, plan_launches, redundancy
from kernels.kmap import KernelMap, _prefix


def strided_map(counts: list[int]) -> KernelMap:
    """A kernel-2 map with these per-offset counts (plan_launches reads only the counts)."""
    assert len(counts) == 8
    total = sum(counts)
    rows = torch.zeros(total, dtype=torch.int32)
    return KernelMap(rows, rows.clone(), _prefix(counts), 2, max(counts), max(counts))


def layout(launches) -> list[tuple[tuple[int, ...], int, int]]:
    return [(launch.kernel_indices, launch.height, launch.start) for launch in launches]


def test_redundancy_is_the_share_of_padded_rows():
    assert redundancy(20, 2, 10) == 0.0  # two full maps: nothing padded
    assert redundancy(15, 2, 10) == 0.25  # 5 of 20 rows padding
    assert redundancy(10, 4, 10) == 0.75


def test_a_group_grows_while_its_redundancy_is_within_epsilon_inclusive():
    kmap = strided_map([10, 5, 0, 0, 0, 0, 0, 0])  # together: 1 - 15 / 20 = 0.25
    assert layout(plan_launches(kmap, 0.25, math.inf)) == [((0, 1), 10, 0)]
    assert layout(plan_launches(kmap, 0.2, math.inf)) == [((0,), 10, 0), ((1,), 5, 10)]


def test_equal_maps_share_a_launch_at_epsilon_zero():
    kmap = strided_map([0, 7, 0, 7, 0, 0, 7, 3])  # three of 7 rows: no padding between them
    assert layout(plan_launches(kmap, 0.0, math.inf)) == [((1, 3, 6), 7, 0), ((7,), 3, 21)]


def test_a_group_runs_padded_only_while_its_largest_map_is_below_s():
    kmap = strided_map([10, 10, 0, 0, 0, 0, 0, 0])
    assert layout(plan_launches(kmap, 0.0, 11)) == [((0, 1), 10, 0)]
    assert layout(plan_launches(kmap, 0.0, 10)) == [((0,), 10, 0), ((1,), 10, 10)]


def test_empty_offsets_take_no_launch():
    kmap = strided_map([4, 0, 2, 0, 0, 1, 0, 0])  # five empty offsets
    for eps, s in ((0.0, 0.0), (0.5, math.inf), (1.0, math.inf)):
        launches = plan_launches(kmap, eps, s)
        assert sorted(k for launch in launches for k in launch.kernel_indices) == [0, 2, 5]
    assert layout(plan_launches(kmap, 1.0, math.inf)) == [((0, 2, 5), 4, 0)]


def test_symmetric_pairs_are_one_unit_and_the_centre_is_none():
    counts = [0] * 27
    counts[0] = counts[26] = 3
    counts[4] = counts[22] = 5
    kmap = KernelMap(
        torch.zeros(16, dtype=torch.int32),
        torch.zeros(16, dtype=torch.int32),
        _prefix(counts),
        3,
        9,
        9,
        identity=13,
        symmetric=True,
    )
    assert layout(plan_launches(kmap, 0.0, 0.0)) == [((4, 22), 5, 0), ((0, 26), 3, 10)]
    assert layout(plan_launches(kmap, 1.0, math.inf)) == [((4, 22, 0, 26), 5, 0)]


@pytest.mark.parametrize("first, second", [((0.3, 4.0), (0.3, 100.0)), ((0.0, 1e9), (1.0, 1e9))])
def test_the_plan_cache_tells_settings_apart(first, second):
    kmap = strided_map([10, 6, 6, 0, 0, 0, 0, 3])
    a, b = build_plan(kmap, *first), build_plan(kmap, *second)
    assert a is not b
    assert layout(a.launches) == layout(plan_launches(kmap, *first))
    assert layout(b.launches) == layout(plan_launches(kmap, *second))
    assert build_plan(kmap, *first) is a
