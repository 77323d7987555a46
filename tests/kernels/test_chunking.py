"""Bounded scratch memory: the engine's chunks under a memory cap give the unchunked results."""

import math

import pytest
import torch

from kernels import grouped
from kernels.chunking import chunks, default_cap, rows_under_cap
from kernels.engine import EngineConfig, sparse_conv
from kernels.grouping import build_plan
from kernels.tuning import GroupingTable
from tests.conftest import DEVICES
from tests.kernels.kernel_helpers import maps_for, random_cloud

SEPARATE = GroupingTable(defaults={"cpu": (0.0, 0.0), "cuda": (0.0, 0.0)})
DENSE = GroupingTable(defaults={"cpu": (1.0, math.inf), "cuda": (1.0, math.inf)})
UNBOUNDED = 1 << 40


@pytest.mark.parametrize("max_rows", [1, 7, 100, 1000, 10**9])
def test_chunks_cover_the_plan_in_row_order(max_rows):
    kmap = maps_for(random_cloud(800, 8, seed=21))["subm"]
    for plan in (build_plan(kmap, 0.0, 0.0), build_plan(kmap, 1.0, math.inf)):
        for per_launch in (False, True):
            parts = chunks(plan, max_rows, per_launch)
            assert parts[0].start == 0 and sum(c.rows for c in parts) == plan.rows
            for a, b in zip(parts, parts[1:]):
                assert a.start + a.rows == b.start
            offsets = {}
            for chunk in parts:
                assert chunk.rows <= max(max_rows, 1)
                assert sum(p.rows for p in chunk.pieces) == chunk.rows
                for piece in chunk.pieces:
                    for k, _first, rows in piece.segments():
                        offsets[k] = offsets.get(k, 0) + rows
            heights = {k: launch.height for launch in plan.launches for k in launch.kernel_indices}
            assert offsets == heights


def cap_for(rows, cin, cout, dtype):
    return rows * (cin + cout) * torch.empty((), dtype=dtype).element_size()


def run_conv(kmap, feats, weight, grouping, cap, deterministic=True):
    f = feats.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    config = EngineConfig(grouping=grouping, deterministic=deterministic, memory_cap=cap)
    with torch.no_grad():
        inference = sparse_conv(feats, weight, kmap, config)
    out = sparse_conv(f, w, kmap, config)
    out.backward(torch.ones_like(out) / out.numel() ** 0.5 + out.detach())
    return inference, out.detach(), f.grad, w.grad


@pytest.mark.parametrize("scatter", ["unique", "csr"])
@pytest.mark.parametrize("kind", ["subm", "down", "up"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tiny_chunks_match_unchunked(monkeypatch, scatter, kind, dtype):
    # "csr" runs the CUDA dataflow's ordered scatter on the CPU twin, chunk by chunk.
    monkeypatch.setattr(grouped, "_scatter_mode", lambda device, deterministic: scatter)
    kmap = maps_for(random_cloud(3000, 10, seed=22))[kind]
    gen = torch.Generator().manual_seed(23)
    feats = torch.randn(kmap.num_in, 6, generator=gen, dtype=dtype)
    weight = torch.randn(kmap.kernel_volume, 6, 5, generator=gen, dtype=dtype)
    for grouping in (SEPARATE, DENSE):
        plan = build_plan(kmap, *grouping.defaults["cpu"][:2])
        whole = run_conv(kmap, feats, weight, grouping, UNBOUNDED)
        # Chunks of whole launches: the same matmuls, the same additions in the same order.
        biggest = max(launch.rows for launch in plan.launches)
        assert len(chunks(plan, biggest)) > 1 or len(plan.launches) == 1
        same = run_conv(kmap, feats, weight, grouping, cap_for(biggest, 6, 5, dtype))
        for a, b in zip(whole, same):
            assert torch.equal(a, b)
        # Tiny chunks split launches into per-offset slices of 13 rows: the matmuls differ in
        # shape, so their rounding may differ; the sums are the same within float precision.
        tiny = run_conv(kmap, feats, weight, grouping, cap_for(13, 6, 5, dtype))
        assert len(chunks(plan, 13)) > plan.rows // 13
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        for a, b in zip(whole, tiny):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_default_cap_bounds_the_scratch(device, monkeypatch):
    coords = random_cloud(3000, 10, seed=24).to(device)
    kmap = maps_for(coords)["subm"]
    monkeypatch.setenv("LIDARSEG_ENGINE_SCRATCH_MB", "0.01")  # 10 KiB
    config = EngineConfig(grouping=DENSE)
    assert (
        config.max_rows(8, 8, torch.float32, torch.device(device))
        == rows_under_cap(10485, 8, 8, torch.float32)
        == 163
    )
    feats = torch.randn(kmap.num_in, 8, device=device)
    weight = torch.randn(27, 8, 8, device=device)
    out = sparse_conv(feats, weight, kmap, config)
    monkeypatch.delenv("LIDARSEG_ENGINE_SCRATCH_MB")
    ref = sparse_conv(feats, weight, kmap, EngineConfig(grouping=DENSE, memory_cap=UNBOUNDED))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    buffers = config.workspace._local.buffers
    assert all(b.numel() <= 163 * 8 for b in buffers.values())


def test_cuda_free_memory_is_read_once_per_interval(monkeypatch):
    """Every conv asks for the cap; cudaMemGetInfo is asked at most once per FREE_MEMORY_TTL_S
    (runs without a GPU: the reading is faked)."""
    import kernels.chunking as chunking

    readings, clock = [], [100.0]
    monkeypatch.delenv("LIDARSEG_ENGINE_SCRATCH_MB", raising=False)
    monkeypatch.setattr(chunking, "_free_readings", {})
    monkeypatch.setattr(chunking.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(
        torch.cuda, "mem_get_info", lambda d: readings.append(d) or (8 << 30, 16 << 30)
    )
    gpu = torch.device("cuda", 0)
    assert default_cap(gpu) == default_cap(gpu) == 2 << 30  # a quarter of 8 GiB free
    assert len(readings) == 1
    clock[0] += chunking.FREE_MEMORY_TTL_S
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: readings.append(d) or (1 << 30, 0))
    assert default_cap(gpu) == 1 << 28  # read again: a quarter of 1 GiB
    assert len(readings) == 2
    # deterministic: an eighth of the total, however much is free (chunks, so rounding, fixed)
    deterministic = EngineConfig(grouping=DENSE, deterministic=True)
    for free in (8 << 30, 1 << 30):
        clock[0] += chunking.FREE_MEMORY_TTL_S
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d, f=free: (f, 16 << 30))
        assert deterministic.scratch_cap(gpu) == 2 << 30
