"""models/sparse_tensor.py and models/layers.py refuse what would silently give wrong rows: a
level given other coordinates, a second downsampling to a level, an inverse conv whose kernel is
not the downsampling's, coords or feats of the wrong shape or device, a concatenation of other
rows or another level, an even submanifold kernel, a channel ratio leaving a stage empty."""

from __future__ import annotations

import pytest
import torch

from models.layers import SparseConv3d, SparseInverseConv3d, SubMConv3d, cat
from models.minkunet import MinkUNetConfig
from models.sparse_tensor import SparseTensor
from tests.kernels.kernel_helpers import random_cloud


def cloud(n=200, seed=1):
    coords = random_cloud(n, 6, seed=seed)
    return coords, torch.randn(len(coords), 3)


def test_a_level_keeps_its_coordinates():
    coords, feats = cloud()
    x = SparseTensor(feats, coords)
    SparseTensor(feats, coords, manager=x.manager)  # the same tensor: fine
    with pytest.raises(ValueError, match="tensor stride 1 already has other coordinates"):
        SparseTensor(feats, coords.clone(), manager=x.manager)


def test_a_second_downsampling_to_a_level_is_refused():
    coords, feats = cloud()
    x = SparseTensor(feats, coords)
    SparseConv3d(3, 3, 2, 2)(x)
    with pytest.raises(ValueError, match="level 2 already exists"):
        SparseConv3d(3, 3, 3, 2)(x)


def test_an_inverse_conv_needs_the_downsampling_kernel():
    coords, feats = cloud()
    y = SparseConv3d(3, 3, 3, 2)(SparseTensor(feats, coords))
    with pytest.raises(
        ValueError, match="made with kernel 3, the inverse convolution has kernel 2"
    ):
        SparseInverseConv3d(3, 3, 2)(y)
    assert SparseInverseConv3d(3, 3, 3)(y).feats.shape == (len(coords), 3)


@pytest.mark.parametrize("shape", [(5, 3), (5, 5), (5,)])
def test_coords_must_be_n_by_4(shape):
    with pytest.raises(ValueError, match=r"coords must be int32 \[N, 4\]"):
        SparseTensor(torch.zeros(5, 2), torch.zeros(shape, dtype=torch.int32))


def test_feats_need_one_row_per_coordinate_on_its_device():
    coords, feats = cloud()
    with pytest.raises(ValueError, match=r"feats must be \[\d+, C\]"):
        SparseTensor(feats[1:], coords)
    x = SparseTensor(feats, coords)
    with pytest.raises(ValueError, match=r"feats must be \[\d+, C\]"):
        x.replace_feats(torch.zeros(len(coords) + 1, 3))
    with pytest.raises(ValueError, match="feats on meta but coords on cpu"):
        x.replace_feats(torch.zeros(len(coords), 3, device="meta"))


def test_cat_needs_the_same_rows():
    coords, feats = cloud()
    a = SparseTensor(feats, coords)
    b = SparseTensor(feats, coords.flip(0).contiguous())  # the same voxels, other row order
    with pytest.raises(ValueError, match="same coordinates, row for row"):
        cat(a, b)
    assert cat(a, SparseTensor(feats * 2, coords.clone())).feats.shape == (len(coords), 6)


def test_an_upsampling_concatenates_only_the_level_it_makes():
    coords, feats = cloud()
    x = SparseTensor(feats, coords)
    y = SparseConv3d(3, 3, 2, 2)(x)
    z = SparseConv3d(3, 3, 2, 2)(y)
    with pytest.raises(ValueError, match="concatenates a tensor of the level it makes"):
        SparseInverseConv3d(3, 3, 2)(z, concat=x)  # z's inverse makes level 2, not 1
    assert SparseInverseConv3d(3, 3, 2)(z, concat=y).feats.shape == (len(y), 6)


def test_a_submanifold_conv_needs_an_odd_kernel():
    with pytest.raises(ValueError, match="odd kernel_size, got 2"):
        SubMConv3d(4, 4, 2)


def test_a_channel_ratio_leaving_a_stage_empty_is_refused():
    with pytest.raises(ValueError, match="leaves a stage without channels"):
        MinkUNetConfig(cr=0.01)  # int(0.01 * 32) = 0
    assert min(MinkUNetConfig(cr=1 / 32).channels) == 1
