"""Our sparse layers against spconv 2.x (CPU) on every real LiDAR frame.

spconv is the reference and runs single-threaded (its CPU path is wrong with more threads, spconv
issue #679); ours runs with two threads. spconv gets coordinates shifted into [0, shape) by a
multiple of 8 per axis; ours gets the unshifted (negative) coordinates, and coordinate sets are
compared after shifting back (coarse level: spconv = floor(c / 2) + shift / 2).
"""

from __future__ import annotations

import zlib

import pytest
import torch
from torch import nn

from models import (
    BatchNorm,
    ReLU,
    SparseConv3d,
    SparseInverseConv3d,
    SparseTensor,
    SubMConv3d,
    cat,
    native_algo,
    weight_from_spconv,
    weight_to_spconv,
)
from tests.conftest import (
    DEVICES,
    FRAMES,
    frame_id,
    match_rows,
    ours_threads,
    rel_err,
    single_thread,
    spconv_grid,
    voxelized_frame,
)

TOL = 1e-4
VOXEL_SIZES = (0.05, 0.1, 0.2)
CHANNELS = (4, 16, 64)
KITTI = FRAMES[0][0]

CASES = [
    pytest.param(name, vs, c, "cpu", id=f"{frame_id(name)}-{vs}m-C{c}")
    for name, _ in FRAMES
    for vs in VOXEL_SIZES
    for c in CHANNELS
]
# Ours on CUDA against the same CPU reference: one frame, every voxel size and width.
CASES += [
    pytest.param(
        KITTI, vs, c, "cuda", id=f"{frame_id(KITTI)}-{vs}m-C{c}-cuda", marks=DEVICES[1].marks
    )
    for vs in VOXEL_SIZES
    for c in CHANNELS
]


def _seed(*parts) -> int:
    """A fixed seed per test case (crc32 of its parameters; independent of PYTHONHASHSEED)."""
    return zlib.crc32(repr(parts).encode())


def _inputs(name: str, vs: float, c: int):
    """(our coords, spconv coords, shift, spatial shape, features) with fixed seeds."""
    coords = voxelized_frame(name, vs)
    shifted, shift, shape = spconv_grid(coords)
    g = torch.Generator().manual_seed(_seed(name, vs, c))
    feats = torch.randn(coords.shape[0], c, generator=g)
    return coords, shifted, shift, shape, feats


def _copy_to_spconv(ours: nn.Module, ref: nn.Module) -> None:
    with torch.no_grad():
        ref.weight.copy_(weight_to_spconv(ours.weight.detach()))


def _unshift(spconv_coords: torch.Tensor, shift: torch.Tensor, level_stride: int) -> torch.Tensor:
    """spconv coords at a level of `level_stride` back into our (unshifted) grid."""
    out = spconv_coords.clone().to(torch.int64)
    out[:, 1:] -= shift // level_stride
    return out.to(torch.int32)


def _ours(layer: nn.Module, x: SparseTensor, device: str) -> SparseTensor:
    """Our layer on `device`, the result back on the CPU (coordinates and features)."""
    with ours_threads():
        o = layer.to(device)(SparseTensor(x.feats.to(device), x.coords.to(device)))
    return SparseTensor(o.feats.cpu(), o.coords.cpu(), o.stride)


@pytest.mark.parametrize("name,vs,c,device", CASES)
def test_submconv3_matches_spconv(spconv, name, vs, c, device):
    coords, shifted, shift, shape, feats = _inputs(name, vs, c)
    torch.manual_seed(_seed("subm3", name, vs, c))
    ours = SubMConv3d(c, c, 3)
    ref = spconv.SubMConv3d(c, c, 3, bias=False, algo=native_algo(), indice_key="subm")
    _copy_to_spconv(ours, ref)
    with torch.no_grad():
        with single_thread():
            r = ref(spconv.SparseConvTensor(feats, shifted, shape, 1))
        o = _ours(ours, SparseTensor(feats, coords), device)
    # SubM keeps the input rows, in input order, on both sides.
    assert torch.equal(r.indices, shifted)
    assert torch.equal(o.coords, coords)
    assert rel_err(o.feats, r.features) <= TOL


def _downsample_pair(spconv, name, vs, c, device="cpu"):
    coords, shifted, shift, shape, feats = _inputs(name, vs, c)
    torch.manual_seed(_seed("down", name, vs, c))
    ours = SparseConv3d(c, c, 2, 2)
    ref = spconv.SparseConv3d(c, c, 2, 2, bias=False, algo=native_algo(), indice_key="down")
    _copy_to_spconv(ours, ref)
    with torch.no_grad():
        with single_thread():
            r = ref(spconv.SparseConvTensor(feats, shifted, shape, 1))
        with ours_threads():
            o = ours.to(device)(SparseTensor(feats.to(device), coords.to(device)))
    return coords, shifted, shift, o, r


@pytest.mark.parametrize("name,vs,c,device", CASES)
def test_sparseconv_k2s2_matches_spconv(spconv, name, vs, c, device):
    coords, _, shift, o, r = _downsample_pair(spconv, name, vs, c, device)
    o = SparseTensor(o.feats.cpu(), o.coords.cpu(), o.stride)
    assert o.stride == 2
    expected = coords.clone()
    expected[:, 1:] = torch.div(expected[:, 1:], 2, rounding_mode="floor")
    assert torch.equal(torch.unique(o.coords, dim=0), torch.unique(expected, dim=0))
    perm = match_rows(o.coords, _unshift(r.indices, shift, 2))  # asserts the same SET
    assert rel_err(o.feats[perm], r.features) <= TOL


@pytest.mark.parametrize("name,vs,c,device", CASES)
def test_inverseconv_k2_matches_spconv(spconv, name, vs, c, device):
    coords, shifted, shift, o, r = _downsample_pair(spconv, name, vs, c, device)
    perm = match_rows(o.coords.cpu(), _unshift(r.indices, shift, 2))
    # Fresh coarse features (so this test does not depend on the downsample's numbers), the same
    # per coordinate on both sides.
    g = torch.Generator().manual_seed(_seed("coarse", name, vs, c))
    coarse = torch.randn(o.coords.shape[0], c, generator=g).to(device)
    torch.manual_seed(_seed("up", name, vs, c))
    ours = SparseInverseConv3d(c, c, 2)
    ref = spconv.SparseInverseConv3d(c, c, 2, bias=False, algo=native_algo(), indice_key="down")
    _copy_to_spconv(ours, ref)
    with torch.no_grad():
        with single_thread():
            ru = ref(r.replace_feature(coarse.cpu()[perm]))
        with ours_threads():
            ou = ours.to(device)(o.replace_feats(coarse))
    ou = SparseTensor(ou.feats.cpu(), ou.coords.cpu(), ou.stride)
    assert ou.stride == 1
    assert torch.equal(ou.coords, coords)  # exactly the fine level, original row order
    assert torch.equal(ru.indices, shifted)
    fine_perm = match_rows(ou.coords, _unshift(ru.indices, shift, 1))
    assert rel_err(ou.feats[fine_perm], ru.features) <= TOL


@pytest.mark.parametrize("kernel_size", [1, 5])
@pytest.mark.parametrize("c_in,c_out", [(16, 16), (16, 32)])
def test_submconv_kernel_1_and_5_match_spconv(spconv, kernel_size, c_in, c_out):
    """Kernel 1 exercises spconv's 1x1 quirk (weight buffer read as [Cin, Cout]); this direction
    copies spconv's own initialisation into ours with weight_from_spconv."""
    coords, shifted, shift, shape, _ = _inputs(KITTI, 0.1, c_in)
    g = torch.Generator().manual_seed(_seed("k15", kernel_size, c_in, c_out))
    feats = torch.randn(coords.shape[0], c_in, generator=g)
    torch.manual_seed(_seed("k15w", kernel_size, c_in, c_out))
    ref = spconv.SubMConv3d(
        c_in, c_out, kernel_size, bias=False, algo=native_algo(), indice_key="k"
    )
    ours = SubMConv3d(c_in, c_out, kernel_size)
    with torch.no_grad():
        ours.weight.copy_(weight_from_spconv(ref.weight.detach()))
        with single_thread():
            r = ref(spconv.SparseConvTensor(feats, shifted, shape, 1))
        with ours_threads():
            o = ours(SparseTensor(feats, coords))
    assert torch.equal(r.indices, shifted)
    assert torch.equal(o.coords, coords)
    assert rel_err(o.feats, r.features) <= TOL
    # and the round trip of the conversion
    assert torch.equal(weight_to_spconv(ours.weight.detach()), ref.weight.detach())


def test_batchnorm_relu_cat_match_spconv_block(spconv):
    """subm -> BatchNorm (eval, non-trivial running stats and affine) -> ReLU -> cat with the
    input, against spconv's SparseSequential(SubMConv3d, BatchNorm1d, ReLU) + torch.cat."""
    c = 16
    coords, shifted, shift, shape, feats = _inputs(KITTI, 0.1, c)
    torch.manual_seed(1234)
    conv, bn, relu = SubMConv3d(c, c, 3), BatchNorm(c), ReLU()
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.2, 0.2)
    bn.eval()
    ref_bn = nn.BatchNorm1d(c)
    ref_bn.load_state_dict(bn.state_dict())
    ref_bn.eval()
    ref_conv = spconv.SubMConv3d(c, c, 3, bias=False, algo=native_algo(), indice_key="blk")
    _copy_to_spconv(conv, ref_conv)
    ref = spconv.SparseSequential(ref_conv, ref_bn, nn.ReLU())
    with torch.no_grad():
        with single_thread():
            xr = spconv.SparseConvTensor(feats, shifted, shape, 1)
            r = ref(xr)
            r_cat = torch.cat([r.features, xr.features], dim=1)
        with ours_threads():
            x = SparseTensor(feats, coords)
            y = relu(bn(conv(x)))
            z = cat(y, x)
    assert y.manager is x.manager and z.manager is x.manager
    assert torch.equal(z.coords, coords)
    assert z.feats.shape == (coords.shape[0], 2 * c)
    assert bool((y.feats >= 0).all())
    assert rel_err(y.feats, r.features) <= TOL
    assert rel_err(z.feats, r_cat) <= TOL
    assert torch.equal(z.feats[:, c:], feats)
    # BatchNorm in eval mode is exactly the per-channel affine of its running statistics
    pre = conv(x).feats.detach()
    with torch.no_grad():
        affine = (pre - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps) * bn.weight + bn.bias
    assert rel_err(bn(conv(x)).feats.detach(), affine) <= 1e-5
    # cat refuses tensors on other coordinates
    other = SparseTensor(feats[:-1], coords[:-1].clone())
    with pytest.raises(ValueError):
        cat(y, other)
