"""CUDA twins against the CPU twins (and spconv on the GPU). Skips cleanly without a GPU.

The oracle and property tests of maps, engine, layers and gradients run on CUDA too (they are
parametrised over tests.conftest.DEVICES); this file holds what only makes sense with a GPU."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels import CoordHashTable, backend, downsample, submanifold_map
from kernels.engine import EngineConfig, sparse_conv
from tests.conftest import REPO_ROOT, rel_err

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
FRAME = (
    Path(__file__).resolve().parents[3]
    / "shared"
    / "data"
    / "real"
    / "semantickitti"
    / "seq00_000000.bin"
)


def frame_coords(voxel=0.05):
    if not FRAME.exists():
        pytest.skip(f"real frame missing: {FRAME}")
    pts = np.fromfile(FRAME, dtype=np.float32).reshape(-1, 4)
    vox = torch.unique(torch.from_numpy(np.floor(pts[:, :3] / voxel).astype(np.int32)), dim=0)
    perm = torch.randperm(len(vox), generator=torch.Generator().manual_seed(0))
    return torch.cat([torch.zeros(len(vox), 1, dtype=torch.int32), vox[perm]], 1).contiguous()


def test_cuda_maps_identical_to_cpu():
    cpu = frame_coords()
    gpu = cpu.cuda()
    for a, b in [
        (
            submanifold_map(cpu, CoordHashTable.build(cpu)),
            submanifold_map(gpu, CoordHashTable.build(gpu)),
        )
    ]:
        assert a.bounds == b.bounds
        assert torch.equal(a.in_idx, b.in_idx.cpu()) and torch.equal(a.out_idx, b.out_idx.cpu())
    ca, _, da = downsample(cpu, CoordHashTable.build(cpu))
    cb, _, db = downsample(gpu, CoordHashTable.build(gpu))
    assert torch.equal(ca, cb.cpu()) and da.bounds == db.bounds
    assert torch.equal(da.in_idx, db.in_idx.cpu()) and torch.equal(da.out_idx, db.out_idx.cpu())


@pytest.mark.parametrize("deterministic", [False, True])
def test_cuda_conv_matches_cpu(deterministic):
    cpu = frame_coords(0.1)
    kmap_cpu = submanifold_map(cpu, CoordHashTable.build(cpu))
    gpu = cpu.cuda()
    kmap_gpu = submanifold_map(gpu, CoordHashTable.build(gpu))
    feats = torch.randn(len(cpu), 64)
    weight = torch.randn(27, 64, 64) / 30
    ref = sparse_conv(feats, weight, kmap_cpu, EngineConfig())
    config = EngineConfig(deterministic=deterministic)
    out = sparse_conv(feats.cuda(), weight.cuda(), kmap_gpu, config)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    half = sparse_conv(feats.cuda().half(), weight.cuda().half(), kmap_gpu, config)
    torch.testing.assert_close(half.float().cpu(), ref, rtol=2e-2, atol=2e-2)
    if deterministic:
        assert torch.equal(sparse_conv(feats.cuda(), weight.cuda(), kmap_gpu, config), out)


def test_cuda_backward_matches_cpu():
    cpu = frame_coords(0.2)
    gpu = cpu.cuda()
    grads = []
    for coords in (cpu, gpu):
        kmap = submanifold_map(coords, CoordHashTable.build(coords))
        gen = torch.Generator().manual_seed(1)
        feats = torch.randn(len(coords), 16, generator=gen).to(coords.device).requires_grad_()
        weight = torch.randn(27, 16, 8, generator=gen).to(coords.device).requires_grad_()
        sparse_conv(feats, weight, kmap, EngineConfig(deterministic=True)).square().sum().backward()
        grads.append((feats.grad.cpu(), weight.grad.cpu()))
    # Relative to the largest value: weight gradients sum thousands of products, so an absolute
    # tolerance would be beaten by rounding alone on the large ones.
    for cpu_grad, cuda_grad in zip(*grads):
        assert rel_err(cuda_grad, cpu_grad) <= 1e-5


def batch_of_frames(voxel: float, copies: int) -> torch.Tensor:
    """The frame at `voxel`, shifted and repeated as batch entries 0..copies-1."""
    one = frame_coords(voxel)
    parts = []
    for b in range(copies):
        c = one.clone()
        c[:, 0] = b
        c[:, 1] += 7 * b
        parts.append(c)
    return torch.cat(parts).contiguous()


@pytest.mark.parametrize("deterministic", [False, True])
def test_cuda_batches_match_cpu(deterministic):
    # Batch > 1: the same coordinates in different batch entries never meet.
    cpu = batch_of_frames(0.2, 3)
    gpu = cpu.cuda()
    a, b = submanifold_map(cpu, CoordHashTable.build(cpu)), submanifold_map(gpu)
    assert a.bounds == b.bounds and torch.equal(a.in_idx, b.in_idx.cpu())
    assert torch.equal(a.out_idx, b.out_idx.cpu())
    ca, _, da = downsample(cpu, None, 2, 2)
    cb, _, db = downsample(gpu, None, 2, 2)
    assert torch.equal(ca, cb.cpu()) and da.bounds == db.bounds
    feats = torch.randn(len(cpu), 32, generator=torch.Generator().manual_seed(3))
    weight = torch.randn(27, 32, 16, generator=torch.Generator().manual_seed(4)) / 20
    ref = sparse_conv(feats, weight, a, EngineConfig())
    out = sparse_conv(feats.cuda(), weight.cuda(), b, EngineConfig(deterministic=deterministic))
    assert rel_err(out.cpu(), ref) <= 1e-5
    down = sparse_conv(feats.cuda(), weight[:8].cuda(), db, EngineConfig())
    assert rel_err(down.cpu(), sparse_conv(feats, weight[:8], da, EngineConfig())) <= 1e-5


def test_cuda_chunked_engine_matches_unchunked():
    cpu = frame_coords(0.1)
    kmap = submanifold_map(cpu.cuda())
    feats = torch.randn(len(cpu), 32, device="cuda")
    weight = torch.randn(27, 32, 32, device="cuda") / 30
    whole = sparse_conv(feats, weight, kmap, EngineConfig(deterministic=True, memory_cap=1 << 40))
    tiny = sparse_conv(feats, weight, kmap, EngineConfig(deterministic=True, memory_cap=1 << 20))
    assert rel_err(tiny, whole) <= 1e-6
    half = sparse_conv(
        feats.half(), weight.half(), kmap, EngineConfig(deterministic=True, memory_cap=1 << 20)
    )
    assert rel_err(half.float(), whole) <= 2e-3


def test_cuda_2m_point_frame_stress():
    # A 2M-voxel batch (the seq00 frame at 5 cm, repeated) through maps, a chunked conv with a
    # 256 MiB cap, and back, against the CPU on a sample of rows.
    one = frame_coords(0.05)
    copies = -(-2_000_000 // len(one))
    coords = batch_of_frames(0.05, copies)[:2_000_000].cuda()
    kmap = submanifold_map(coords)
    _, _, dmap = downsample(coords, None, 2, 2)
    feats = torch.randn(len(coords), 32, device="cuda")
    weight = torch.randn(27, 32, 32, device="cuda") / 30
    config = EngineConfig(memory_cap=256 << 20)
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = sparse_conv(feats, weight, kmap, config)
    down = sparse_conv(feats, weight[:8], dmap, config)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    print(f"2M-point stress: {sum(kmap.counts)} map entries, peak extra {extra / 2**20:.0f} MiB")
    # outputs, the chunk buffers (cap + 25% slack), the plans' gather/scatter rows (int32 x 2)
    bound = (
        (out.numel() + down.numel()) * 4
        + (256 << 20) * 5 // 4
        + 8 * (sum(kmap.counts) + sum(dmap.counts))
        + (64 << 20)
    )
    assert extra < bound, f"{extra} bytes > {bound}"
    rows = torch.arange(0, len(one), 97)  # the first copy's rows compared with the CPU
    cpu_kmap = submanifold_map(one)
    ref = sparse_conv(feats[: len(one)].cpu(), weight.cpu(), cpu_kmap, EngineConfig())
    assert rel_err(out[rows].cpu(), ref[rows]) <= 1e-5


def test_cuda_sync_mode_names_the_failing_op():
    # A kernel fault (an out-of-bounds CSR row) with LIDARSEG_CUDA_SYNC=1 raises at the op that
    # launched it, with CUDA's error text. In a subprocess: the fault ruins its CUDA context.
    script = (
        "import torch\n"
        "from kernels import backend\n"
        "d = torch.device('cuda')\n"
        "src = torch.ones(4, 8, device=d)\n"
        "ptr = torch.tensor([0, 1], dtype=torch.int64, device=d)\n"
        "rows = torch.tensor([1 << 30], dtype=torch.int32, device=d)\n"
        "dst = torch.zeros(1, 8, device=d)\n"
        "backend.call('scatter_add_csr_f32', d, src, 8, ptr, rows, 1, 0, 1 << 31, dst)\n"
    )
    env = dict(os.environ, LIDARSEG_CUDA_SYNC="1")
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert (
        "KernelError: ls_scatter_add_csr_f32_cuda: CUDA error: cudaStreamSynchronize:"
        in proc.stderr
    ), proc.stderr[-2000:]
    assert "illegal memory access" in proc.stderr


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_ops_run_on_their_tensors_device():
    coords = frame_coords(0.2).to("cuda:1")
    with torch.cuda.device(0):
        kmap = submanifold_map(coords)
        feats = torch.randn(len(coords), 16, device="cuda:1")
        out = sparse_conv(feats, torch.randn(27, 16, 16, device="cuda:1"), kmap, EngineConfig())
    assert out.device == torch.device("cuda:1") and kmap.device == torch.device("cuda:1")


def test_cpu_tensor_in_a_cuda_op_is_refused():
    src = torch.zeros(4, 8, device="cuda")
    with pytest.raises(ValueError, match="idx is on cpu, the op runs on cuda:0"):
        backend.call(
            "gather_rows_f32",
            src.device,
            src,
            4,
            8,
            torch.zeros(2, dtype=torch.int32),
            2,
            torch.empty(2, 8, device="cuda"),
        )


def test_cuda_matches_spconv():
    spconv = pytest.importorskip("spconv.pytorch")
    from models import SparseTensor, SubMConv3d, weight_from_spconv

    coords = frame_coords(0.1)
    shifted = coords.clone()
    shifted[:, 1:] -= shifted[:, 1:].min(0).values
    shape = (shifted[:, 1:].max(0).values + 1).tolist()
    ref_layer = spconv.SubMConv3d(32, 32, 3, bias=False, indice_key="s").cuda()
    ours = SubMConv3d(32, 32, 3).cuda()
    with torch.no_grad():
        ours.weight.copy_(weight_from_spconv(ref_layer.weight))
        feats = torch.randn(len(coords), 32, device="cuda")
        ref = ref_layer(spconv.SparseConvTensor(feats, shifted.cuda(), shape, 1)).features
        out = ours(SparseTensor(feats, coords.cuda())).feats
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
