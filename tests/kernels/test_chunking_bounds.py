"""kernels/chunking.py at its edges: a chunk filled to exactly max_rows, and rows under the cap
counted in the dtype's own bytes."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.chunking import chunks, rows_under_cap
from kernels.grouping import build_plan
from tests.kernels.kernel_helpers import maps_for, random_cloud


def test_rows_under_cap_count_the_dtypes_bytes():
    assert rows_under_cap(1024, 4, 4, torch.float32) == 32
    assert rows_under_cap(1024, 4, 4, torch.bfloat16) == 64  # half the bytes: twice the rows
    assert rows_under_cap(1024, 4, 4, torch.float64) == 16
    assert rows_under_cap(10, 4, 4, torch.float32) == 1  # at least one row


@pytest.mark.parametrize("grouping", [(0.0, 0.0), (1.0, math.inf)])
def test_a_chunk_may_hold_exactly_max_rows(grouping):
    """A plan of R rows under max_rows R is one chunk; a chunk the first two launches fill to
    exactly max_rows holds both (a `>=` flushed each chunk one piece early)."""
    kmap = maps_for(random_cloud(800, 8, seed=21))["subm"]
    plan = build_plan(kmap, *grouping)
    (whole,) = chunks(plan, plan.rows)
    assert whole.start == 0 and whole.rows == plan.rows
    if len(plan.launches) < 2:
        return  # one launch (dense grouping): the whole plan above is the edge
    heights = [launch.rows for launch in plan.launches]
    exact = sum(heights[:2])  # the first two launches fill a chunk of this size exactly
    first = chunks(plan, exact)[0]
    assert first.rows == exact and len(first.pieces) == 2
