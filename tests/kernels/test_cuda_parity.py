"""CUDA twins against the CPU twins (and spconv on the GPU). Skips cleanly without a GPU."""
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels import CoordHashTable, downsample, submanifold_map
from kernels.engine import EngineConfig, sparse_conv

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
FRAME = (Path(__file__).resolve().parents[3] / "shared" / "data" / "real" / "semantickitti"
         / "seq00_000000.bin")


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
    for a, b in [(submanifold_map(cpu, CoordHashTable.build(cpu)),
                  submanifold_map(gpu, CoordHashTable.build(gpu)))]:
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
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-3)


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
