"""kernels/downsampling.py's hash-table path at its edges: batch indices of 512 and more (their
packed keys have the top bit set) and twin rows when the rows come unsorted."""

from __future__ import annotations

import pytest
import torch

from kernels import DuplicateCoordinateError, downsample
from kernels.reference import brute_force_map, map_entries, unique_floor
from tests.kernels.kernel_helpers import coords_tensor


@pytest.mark.parametrize("kernel_size", [2, 3])
def test_outputs_ascend_across_batch_512(kernel_size):
    """Batch 512 packs into the key's top bit: sorted as signed int64 unflipped, its outputs
    came before batch 511's (and the coarser levels' sorted paths were fed unsorted rows)."""
    rows = [(512, 4, 0, 0), (511, 3, 1, 1), (1022, 0, 0, 0), (0, 5, 5, 5), (511, -3, 0, 0)]
    cloud = coords_tensor(rows)  # unsorted: kernel == stride takes the hash table too
    out, _, kmap = downsample(cloud, None, kernel_size, 2)
    assert torch.equal(out, unique_floor(cloud, 2))
    assert out[:, 0].tolist() == [0, 511, 511, 512, 1022]
    assert map_entries(kmap) == brute_force_map(cloud, out, kernel_size, 2, 0)


def test_twin_rows_are_refused_on_the_hash_path():
    """Unsorted rows decline the sorted path; a twin there would take its twin's (parent,
    position) cell and drop out of the map unseen."""
    cloud = coords_tensor([(0, 3, 0, 0), (0, 1, 2, 3), (0, 0, 0, 0), (0, 1, 2, 3)])
    with pytest.raises(DuplicateCoordinateError, match=r"rows \[1, 3\]"):
        downsample(cloud, None, 2, 2)
