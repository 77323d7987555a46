"""The grouped gather-matmul-scatter engine against the one-entry-at-a-time oracle."""

import math

import pytest
import torch

from kernels.engine import EngineConfig, sparse_conv
from kernels.rows import gather_rows, scatter_add_rows
from kernels.grouping import (
    _csr_by_key_torch,
    _fill_at_once,
    _fill_by_offset,
    build_plan,
    csr_by_key,
)
from kernels.reference import conv_from_entries, map_entries
from kernels import reference
from kernels.tuning import GroupingTable
from tests.conftest import DEVICES
from tests.kernels.kernel_helpers import maps_for, random_cloud

SEPARATE = GroupingTable(defaults={"cpu": (0.0, 0.0), "cuda": (0.0, 0.0)})
DENSE = GroupingTable(defaults={"cpu": (1.0, math.inf), "cuda": (1.0, math.inf)})
ADAPTIVE = GroupingTable(defaults={"cpu": (0.3, 1e9), "cuda": (0.3, 1e9)})
FUSED = GroupingTable(defaults={"cpu": (0.0, 0.0, "fused"), "cuda": (0.0, 0.0, "grouped")})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["subm", "down", "up"])
def test_engine_matches_oracle(device, kind):
    coords = random_cloud(300, 6, seed=1)
    kmap = maps_for(coords.to(device))[kind]
    gen = torch.Generator().manual_seed(2)
    feats = torch.randn(kmap.num_in, 5, generator=gen, dtype=torch.float64)
    weight = torch.randn(kmap.kernel_volume, 5, 7, generator=gen, dtype=torch.float64)
    expected = conv_from_entries(feats, weight, map_entries(kmap), kmap.num_out)
    for grouping in (SEPARATE, DENSE, ADAPTIVE):
        for deterministic in (False, True):
            config = EngineConfig(grouping=grouping, deterministic=deterministic)
            out = sparse_conv(feats.to(device), weight.to(device), kmap, config)
            torch.testing.assert_close(out.cpu(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["subm", "down", "up"])
@pytest.mark.parametrize("cin, cout", [(4, 16), (16, 32), (64, 64), (32, 80), (96, 48), (8, 7)])
def test_fused_cpu_dataflow_matches_oracle(kind, cin, cout):
    # fp32 fused gather-GEMM-scatter (any channel count; falls back where it cannot run).
    coords = random_cloud(400, 6, seed=11)
    kmap = maps_for(coords)[kind]
    gen = torch.Generator().manual_seed(12)
    feats = torch.randn(kmap.num_in, cin, generator=gen, dtype=torch.float64)
    weight = torch.randn(kmap.kernel_volume, cin, cout, generator=gen, dtype=torch.float64)
    expected = conv_from_entries(feats, weight, map_entries(kmap), kmap.num_out)
    feats32 = feats.float().requires_grad_()
    weight32 = weight.float().requires_grad_()
    out = sparse_conv(feats32, weight32, kmap, EngineConfig(grouping=FUSED))
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    # Backward through the fused path (transposed map) against float64 autograd of the oracle.
    grad = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    out.backward(grad.float())
    f64, w64 = feats.clone().requires_grad_(), weight.clone().requires_grad_()
    conv_from_entries(f64, w64, map_entries(kmap), kmap.num_out).backward(grad)
    torch.testing.assert_close(feats32.grad.double(), f64.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(weight32.grad.double(), w64.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["subm", "down", "up"])
@pytest.mark.parametrize("grouping", [SEPARATE, DENSE], ids=["separate", "dense"])
def test_gradcheck(device, kind, grouping):
    coords = random_cloud(60, 3, seed=3)
    kmap = maps_for(coords.to(device))[kind]
    gen = torch.Generator().manual_seed(4)
    feats = torch.randn(kmap.num_in, 3, generator=gen, dtype=torch.float64).to(device)
    weight = torch.randn(kmap.kernel_volume, 3, 2, generator=gen, dtype=torch.float64).to(device)
    feats.requires_grad_()
    weight.requires_grad_()
    config = EngineConfig(grouping=grouping, deterministic=True)
    assert torch.autograd.gradcheck(lambda f, w: sparse_conv(f, w, kmap, config), (feats, weight))


def test_plan_shapes():
    coords = random_cloud(2000, 10, seed=5, batches=1)
    kmap = maps_for(coords)["subm"]
    counts = kmap.counts
    separate = build_plan(kmap, 0.0, 0.0)
    # Separate: every symmetric pair is one unpadded bmm of two offsets.
    for launch in separate.launches:
        a, b = launch.kernel_indices
        assert a + b == 26 and counts[a] == counts[b] == launch.height
    assert separate.rows == sum(counts) - counts[13]
    dense = build_plan(kmap, 1.0, math.inf)
    assert len(dense.launches) == 1 and len(dense.launches[0].kernel_indices) == 26
    assert dense.rows == 26 * max(c for k, c in enumerate(counts) if k != 13)
    # Padding rows are marked -1 on both sides.
    assert int((dense.gather_idx < 0).sum()) == int((dense.scatter_idx < 0).sum())
    assert kmap.plans[(0.0, 0.0, False)] is separate  # cached on the map


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["subm", "down", "up"])
@pytest.mark.parametrize("eps, s", [(0.0, 0.0), (1.0, math.inf), (0.3, 1e9), (0.5, 40.0)])
def test_buffer_rows_hold_each_launch_offsets_entries(device, kind, eps, s):
    # The plan's buffer against the layout rule offset by offset: launch after launch, offset
    # j's entries from row start + j * height on, padding -1 after them. Both fillers run on
    # every device (the plan uses the per-offset one on the CPU, the few-ops one on CUDA).
    kmap = maps_for(random_cloud(500, 7, seed=13).to(device))[kind]
    plan = build_plan(kmap, eps, s)
    gather = torch.full((plan.rows,), -1, dtype=torch.int32)
    scatter = torch.full((plan.rows,), -1, dtype=torch.int32)
    for launch in plan.launches:
        for j, k in enumerate(launch.kernel_indices):
            ins, outs = kmap.entries(k)
            lo = launch.start + j * launch.height
            gather[lo : lo + len(ins)], scatter[lo : lo + len(outs)] = ins.cpu(), outs.cpu()
    assert plan.gather_idx.device == kmap.device
    assert torch.equal(plan.gather_idx.cpu(), gather)
    assert torch.equal(plan.scatter_idx.cpu(), scatter)
    for fill in (_fill_by_offset, _fill_at_once):
        g = torch.full((plan.rows + 1,), -1, dtype=torch.int32, device=device)
        sc = torch.full_like(g, -1)
        fill(plan, g, sc)
        assert torch.equal(g[:-1].cpu(), gather) and torch.equal(sc[:-1].cpu(), scatter)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_mode_is_bitwise_repeatable(device):
    coords = random_cloud(20000, 40, seed=6).to(device)
    kmap = maps_for(coords)["subm"]
    feats = torch.randn(kmap.num_in, 32, device=device)
    weight = torch.randn(27, 32, 32, device=device)
    config = EngineConfig(deterministic=True)
    first = sparse_conv(feats, weight, kmap, config)
    for _ in range(3):
        assert torch.equal(sparse_conv(feats, weight, kmap, config), first)


def test_result_does_not_depend_on_thread_count():
    coords = random_cloud(20000, 40, seed=7)
    kmap = maps_for(coords)["subm"]
    feats = torch.randn(kmap.num_in, 16)
    weight = torch.randn(27, 16, 16)
    before = torch.get_num_threads()
    for grouping in (SEPARATE, FUSED):
        try:
            torch.set_num_threads(1)
            one = sparse_conv(feats, weight, kmap, EngineConfig(grouping=grouping))
            torch.set_num_threads(2)
            two = sparse_conv(feats, weight, kmap, EngineConfig(grouping=grouping))
        finally:
            torch.set_num_threads(before)
        # Each output row adds its offsets in plan order whatever the thread count.
        assert torch.equal(one, two)


@pytest.mark.parametrize("twin", [csr_by_key, _csr_by_key_torch])  # the C kernel, CUDA's torch
def test_csr_by_key_twins_agree_and_refuse_keys_past_the_end(twin):
    from kernels.backend import KernelError

    keys = torch.tensor([3, -1, 0, 3, 2, -1, 0], dtype=torch.int32)
    ptr, rows = twin(keys, 5)
    assert ptr.tolist() == [0, 2, 2, 3, 5, 5] and rows.tolist() == [2, 6, 4, 0, 3]
    with pytest.raises(KernelError, match="bad argument"):
        twin(torch.tensor([0, 5, 1], dtype=torch.int32), 5)


@pytest.mark.parametrize("device", DEVICES)
def test_row_kernels_refuse_negative_shapes_on_both_twins(device):
    """common.h's gather_args / scatter_csr_args on each twin: a negative width reached the
    CPU gather's memset as a huge size (a crash) while CUDA's returned quietly."""
    from kernels import backend

    src = torch.zeros(4, 3, device=device)
    idx = torch.zeros(2, dtype=torch.int32, device=device)
    dst = torch.zeros(2, 3, device=device)
    for n, c, m in ((4, -3, 2), (-1, 3, 2), (4, 3, -2)):
        with pytest.raises(backend.KernelError, match="bad argument"):
            backend.call("gather_rows_f32", src.device, src, n, c, idx, m, dst)
    ptr = torch.zeros(3, dtype=torch.int64, device=device)
    for c, lo, hi in ((-3, 0, 4), (3, 2, 1), (3, -1, 4)):
        with pytest.raises(backend.KernelError, match="bad argument"):
            backend.call("scatter_add_csr_f32", src.device, src, c, ptr, idx, 2, lo, hi, dst)
    backend.call("gather_rows_f32", src.device, src, 4, 3, idx, 0, dst)  # empty: nothing to do
    backend.call("scatter_add_csr_f32", src.device, src, 3, ptr, idx, 2, 1, 1, dst)
    assert not dst.any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gather_and_scatter_kernels(device, dtype):
    gen = torch.Generator().manual_seed(8)
    src = torch.randn(50, 9, generator=gen, dtype=dtype).to(device)
    idx = torch.randint(-1, 50, (200,), generator=gen, dtype=torch.int32).to(device)
    torch.testing.assert_close(gather_rows(src, idx), reference.gather_rows(src, idx))
    rows = torch.randn(200, 9, generator=gen, dtype=dtype).to(device)
    dst = torch.randn(50, 9, generator=gen, dtype=dtype).to(device)
    expected = reference.scatter_add_rows(rows, dst.clone(), idx)
    got = scatter_add_rows(rows, dst.clone(), idx, csr_by_key(idx, 50))
    torch.testing.assert_close(got, expected)
    if device == "cuda":
        torch.testing.assert_close(scatter_add_rows(rows, dst.clone(), idx, None), expected)


def test_bad_arguments_are_clear():
    coords = random_cloud(100, 5, seed=9)
    kmap = maps_for(coords)["subm"]
    with pytest.raises(ValueError, match="weight must be"):
        sparse_conv(torch.randn(kmap.num_in, 4), torch.randn(9, 4, 4), kmap, EngineConfig())
    with pytest.raises(ValueError, match="feats must be"):
        sparse_conv(torch.randn(3, 4), torch.randn(27, 4, 4), kmap, EngineConfig())
    with pytest.raises(ValueError, match="unsupported dtype"):
        sparse_conv(
            torch.randn(kmap.num_in, 4).half(), torch.randn(27, 4, 4).half(), kmap, EngineConfig()
        )
    # Mixed devices are refused before any kernel runs (meta stands in for a second device).
    with pytest.raises(ValueError, match="different devices: feats on cpu, weight on meta"):
        sparse_conv(
            torch.randn(kmap.num_in, 4), torch.randn(27, 4, 4, device="meta"), kmap, EngineConfig()
        )
    with pytest.raises(ValueError, match="kernel map on cpu, bias on meta"):
        sparse_conv(
            torch.randn(kmap.num_in, 4),
            torch.randn(27, 4, 4),
            kmap,
            EngineConfig(),
            bias=torch.zeros(4, device="meta"),
        )


@pytest.mark.parametrize("classes", [1, 19, 256])
def test_argmax_rows_matches_torch(classes):
    """The pipeline's per-voxel classes: torch.argmax's answer, ties to the first, a NaN wins;
    other devices, dtypes and widths are left to torch."""
    from kernels.rows import argmax_rows_u8

    g = torch.Generator().manual_seed(classes)
    x = torch.randint(0, 4, (70_000, classes), generator=g).float()  # many ties
    x[5, :] = 0.0
    x[7, classes // 2] = float("nan")
    x[9, -1] = float("inf")
    assert torch.equal(argmax_rows_u8(x).long(), torch.argmax(x, dim=1))
    assert argmax_rows_u8(x[:, :0]) is None and argmax_rows_u8(x.double()) is None
    assert argmax_rows_u8(torch.zeros(3, 257)) is None


@pytest.mark.parametrize("classes", [1, 16, 17, 19, 32])
def test_head_and_argmax_in_one_pass_match_torch(classes):
    """The pipeline's head + argmax (logits never written) against torch's linear then argmax:
    exact ties go to the first class, a NaN logit wins, the padding lanes beyond the classes
    never do (every logit negative). Beyond 32 classes, or with autograd on, torch's."""
    from kernels.rows import linear_argmax_u8

    g = torch.Generator().manual_seed(classes)
    x = torch.rand(1003, 48, generator=g)  # not a multiple of the 8-row tile
    w, b = torch.randn(classes, 48, generator=g), torch.randn(classes, generator=g)
    x[17, 5] = float("nan")  # every logit of that row NaN: class 0, as torch.argmax
    tied_w, tied_b = w.clone(), b.clone()
    tied_w[classes - 1], tied_b[classes - 1] = w[0], b[0]  # the last class ties class 0
    one_nan = w.clone()  # x[40:48, 1] = 0 times +inf: class c / 2 alone NaN in those rows
    one_nan[classes // 2, 1] = float("inf")
    x[40:48, 1] = 0
    cases = [(w, b), (w, None), (tied_w, tied_b), (one_nan, b), (w, b - 200)]
    with torch.no_grad():
        for weight, bias in cases:  # the last: every logit far below 0
            expected = torch.nn.functional.linear(x, weight, bias).argmax(dim=1)
            assert torch.equal(linear_argmax_u8(x, weight, bias).long(), expected)
        assert linear_argmax_u8(x, torch.randn(33, 48), None) is None
        assert linear_argmax_u8(x.double(), w.double(), None) is None
    assert linear_argmax_u8(x, w, b) is None  # autograd on
