"""kernels/chunking.py's edges the other tests never reach: a CUDA cap under MIN_CAP (the
device's memory stood in), per-launch chunks and their cache, the workspace's buffers past
max_rows and its flags."""

from __future__ import annotations

import pytest
import torch

from kernels import chunking
from kernels.chunking import MIN_CAP, Workspace, chunks, default_cap
from kernels.grouping import build_plan
from tests.kernels.kernel_helpers import maps_for, random_cloud

GIB = 1 << 30
CUDA = torch.device("cuda", 0)


@pytest.fixture
def device_memory(monkeypatch):
    """Sets the (free, total) bytes the CUDA device reports."""
    monkeypatch.delenv("LIDARSEG_ENGINE_SCRATCH_MB", raising=False)

    def report(free: int, total: int) -> None:
        monkeypatch.setattr(chunking, "_cuda_memory", lambda device: (free, total))

    return report


def test_the_cuda_cap_is_never_under_min_cap(device_memory):
    device_memory(100, 80 * GIB)
    assert default_cap(CUDA) == MIN_CAP


def test_per_launch_chunks_hold_one_launch_each_and_are_cached_apart():
    plan = build_plan(maps_for(random_cloud(800, 8, seed=21))["subm"], 0.0, 0.0)
    assert len(plan.launches) > 2
    together = chunks(plan, plan.rows)
    apart = chunks(plan, plan.rows, per_launch=True)
    assert len(together) == 1
    assert [(c.start, c.rows) for c in apart] == [(la.start, la.rows) for la in plan.launches]
    assert chunks(plan, plan.rows) is together and chunks(plan, plan.rows, True) is apart


def test_a_workspace_buffer_holds_the_rows_asked_for_even_past_max_rows():
    ws = Workspace()
    got = ws.get(0, 10, 3, torch.float32, torch.device("cpu"), max_rows=4)
    assert got.shape == (10, 3)
    got.fill_(1.0)  # every element writable: the buffer is large enough
    assert ws.get(0, 12, 3, torch.float32, torch.device("cpu")).shape == (12, 3)


def test_a_workspace_flag_is_cleared_each_time_it_is_handed_out():
    ws = Workspace()
    tensor, array = ws.flag(0)
    tensor[0] = 5
    again, view = ws.flag(0)
    assert again is tensor and int(again[0]) == 0 and view[0] == 0
