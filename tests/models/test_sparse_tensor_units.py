"""models/sparse_tensor.py and models/layers.py refuse what would silently give wrong rows: a
level given other coordinates, a second downsampling to a level, an inverse conv whose kernel is
not the downsampling's, coords or feats of the wrong shape or device, a concatenation of other
rows or another level, an even submanifold kernel; and the map queue builds a level's maps only
once that level exists."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from models.layers import SparseConv3d, SparseInverseConv3d, SubMConv3d, cat
from models.minkunet import MinkUNet, MinkUNetConfig
from models.sparse_tensor import CoordinateManager, MapRequest, SparseTensor, _MapQueue
from tests.kernels.test_engine import random_cloud


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


def test_the_map_queue_waits_for_a_submanifold_maps_level():
    coords, _ = cloud()
    manager = CoordinateManager()
    manager.add_level(1, coords)
    queue = _MapQueue(manager, [MapRequest("submanifold", 2, 3), MapRequest("submanifold", 1, 3)])
    assert queue.take() == MapRequest("submanifold", 1, 3)  # level 2 not made yet
    taken = []
    waiter = threading.Thread(target=lambda: taken.append(queue.take()))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not taken  # still waiting for level 2
    manager.downsample(1, 2, 2)
    queue.level_made()
    waiter.join(5)
    assert taken == [MapRequest("submanifold", 2, 3)]


def test_a_minkunets_requests_are_the_maps_its_forward_builds():
    """map_requests against what a forward pass leaves cached (a wrong level in a request made
    a map nobody used, while the one used was built inside the network)."""
    coords, _ = cloud(400)
    model = MinkUNet(in_channels=3, num_classes=4, cr=0.25).eval()
    planned = CoordinateManager()
    planned.add_level(1, coords)
    with ThreadPoolExecutor(1) as helper:
        planned.prepare(model.map_requests(), helper)
    x = SparseTensor(torch.randn(len(coords), 3), coords)
    with torch.no_grad():
        model(x)
    assert planned.built() == x.manager.built()
