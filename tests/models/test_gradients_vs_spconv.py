"""Gradients of our convolutions against spconv's (CPU, single-threaded reference) on a real frame.

Input: the 3000 voxels of SemanticKITTI seq00 frame 0 (0.1 m) nearest the sensor, a dense
region with many neighbours. loss = (out * R).sum() with R fixed per output coordinate; the
gradients wrt the input features and the weight (spconv's converted with weight_from_spconv)
must agree within 1e-4 relative.

spconv 2.3.8's CPU backward (spconv/pytorch/ops.py, indice_conv_backward) calls
get_current_stream() -> torch.cuda.current_stream() before its CPU branch, which raises "Torch not
compiled with CUDA enabled" on a CPU-only torch; the fixture below makes that call return 0 (the
CPU branch never uses the stream).
"""

from __future__ import annotations

import pytest
import torch

from models import (
    SparseConv3d,
    SparseInverseConv3d,
    SparseTensor,
    SubMConv3d,
    native_algo,
    weight_from_spconv,
    weight_to_spconv,
)
from tests.conftest import (
    DEVICES,
    FRAMES,
    load_frame,
    match_rows,
    ours_threads,
    rel_err,
    single_thread,
    spconv_grid,
    voxelize,
)

TOL = 1e-4
N_VOXELS = 3000
CIN, COUT = 16, 24


@pytest.fixture
def spconv(spconv, monkeypatch):
    """spconv.pytorch with its CPU backward usable on a CPU-only torch (see the docstring)."""
    import spconv.pytorch.ops as spconv_ops

    if not torch.cuda.is_available():
        monkeypatch.setattr(spconv_ops, "get_current_stream", lambda: 0)
    return spconv


def _subset() -> torch.Tensor:
    coords = voxelize(load_frame(FRAMES[0][0]), 0.1)
    dist = coords[:, 1:].to(torch.float64).norm(dim=1)
    keep = torch.sort(
        torch.argsort(dist, stable=True)[:N_VOXELS]
    ).values  # keep voxelize's row order
    return coords[keep].contiguous()


def _unshift(c: torch.Tensor, shift: torch.Tensor, stride: int) -> torch.Tensor:
    out = c.clone()
    out[:, 1:] -= (shift // stride).to(torch.int32)
    return out


def _grads(out_feats, r, leaf_feats, weight):
    """Gradients of (out * r).sum() wrt the leaf features and the weight, on the CPU."""
    (out_feats * r.to(out_feats.device)).sum().backward()
    return leaf_feats.grad.cpu(), weight.grad.cpu()


@pytest.mark.parametrize("device", DEVICES)
def test_submconv3_gradients_match_spconv(spconv, device):
    coords = _subset()
    shifted, shift, shape = spconv_grid(coords)
    g = torch.Generator().manual_seed(11)
    feats = torch.randn(len(coords), CIN, generator=g)
    r = torch.randn(len(coords), COUT, generator=g)
    torch.manual_seed(12)
    ours = SubMConv3d(CIN, COUT, 3)
    ref = spconv.SubMConv3d(CIN, COUT, 3, bias=False, algo=native_algo(), indice_key="s")
    with torch.no_grad():
        ref.weight.copy_(weight_to_spconv(ours.weight))
    with single_thread():
        f_ref = feats.clone().requires_grad_()
        y_ref = ref(spconv.SparseConvTensor(f_ref, shifted, shape, 1))
        gf_ref, gw_ref = _grads(y_ref.features, r, f_ref, ref.weight)
    with ours_threads():
        f = feats.to(device).requires_grad_()
        x = SparseTensor(f, coords.to(device))
        y = ours.to(device)(x)
        gf, gw = _grads(y.feats, r, f, ours.weight)
        kmap_rows = sum(x.manager.submanifold_map(1, 3).counts) - len(coords)
    assert kmap_rows > 2 * len(coords), "subset too sparse to exercise the neighbour offsets"
    assert torch.equal(y_ref.indices, shifted)
    assert rel_err(y.feats.cpu(), y_ref.features) <= TOL
    assert rel_err(gf, gf_ref) <= TOL
    assert rel_err(gw, weight_from_spconv(gw_ref)) <= TOL


@pytest.mark.parametrize("device", DEVICES)
def test_sparseconv_k2s2_gradients_match_spconv(spconv, device):
    coords = _subset()
    shifted, shift, shape = spconv_grid(coords)
    g = torch.Generator().manual_seed(31)
    feats = torch.randn(len(coords), CIN, generator=g)
    torch.manual_seed(32)
    ours = SparseConv3d(CIN, COUT, 2, 2)
    ref = spconv.SparseConv3d(CIN, COUT, 2, 2, bias=False, algo=native_algo(), indice_key="d")
    with torch.no_grad():
        ref.weight.copy_(weight_to_spconv(ours.weight))
    with single_thread():
        f_ref = feats.clone().requires_grad_()
        y_ref = ref(spconv.SparseConvTensor(f_ref, shifted, shape, 1))
    with ours_threads():
        f = feats.to(device).requires_grad_()
        y = ours.to(device)(SparseTensor(f, coords.to(device)))
    perm = match_rows(y.coords.cpu(), _unshift(y_ref.indices, shift, 2))  # y.coords[perm] == ref
    r = torch.randn(len(y.coords), COUT, generator=g)  # R on our coarse rows
    with single_thread():
        gf_ref, gw_ref = _grads(y_ref.features, r[perm], f_ref, ref.weight)
    with ours_threads():
        gf, gw = _grads(y.feats, r, f, ours.weight)
    assert rel_err(y.feats.detach().cpu()[perm], y_ref.features) <= TOL
    assert rel_err(gf, gf_ref) <= TOL  # fine rows: the same order on both sides
    assert rel_err(gw, weight_from_spconv(gw_ref)) <= TOL


@pytest.mark.parametrize("device", DEVICES)
def test_inverseconv_k2_gradients_match_spconv(spconv, device):
    coords = _subset()
    shifted, shift, shape = spconv_grid(coords)
    g = torch.Generator().manual_seed(41)
    fine = torch.randn(len(coords), CIN, generator=g)
    torch.manual_seed(42)
    down = SparseConv3d(CIN, CIN, 2, 2)
    ref_down = spconv.SparseConv3d(CIN, CIN, 2, 2, bias=False, algo=native_algo(), indice_key="d")
    ours = SparseInverseConv3d(CIN, COUT, 2)
    ref = spconv.SparseInverseConv3d(CIN, COUT, 2, bias=False, algo=native_algo(), indice_key="d")
    with torch.no_grad():
        ref_down.weight.copy_(weight_to_spconv(down.weight))
        ref.weight.copy_(weight_to_spconv(ours.weight))
        with single_thread():
            c_ref = ref_down(spconv.SparseConvTensor(fine, shifted, shape, 1))
        with ours_threads():
            c = down.to(device)(SparseTensor(fine.to(device), coords.to(device)))
    perm = match_rows(c.coords.cpu(), _unshift(c_ref.indices, shift, 2))
    coarse = torch.randn(len(c.coords), CIN, generator=g)  # leaf features on our coarse rows
    r = torch.randn(len(coords), COUT, generator=g)  # R on the fine rows
    with single_thread():
        leaf_ref = coarse[perm].clone().requires_grad_()
        y_ref = ref(c_ref.replace_feature(leaf_ref))
        gc_ref, gw_ref = _grads(y_ref.features, r, leaf_ref, ref.weight)
    with ours_threads():
        leaf = coarse.to(device).requires_grad_()
        y = ours.to(device)(c.replace_feats(leaf))
        gc, gw = _grads(y.feats, r, leaf, ours.weight)
    assert torch.equal(y.coords.cpu(), coords) and torch.equal(y_ref.indices, shifted)
    assert rel_err(y.feats.detach().cpu(), y_ref.features) <= TOL
    assert rel_err(gc[perm], gc_ref) <= TOL
    assert rel_err(gw, weight_from_spconv(gw_ref)) <= TOL
