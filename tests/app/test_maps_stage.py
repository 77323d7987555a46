"""The maps stage builds every map the network uses and nothing it does not: after it, the
network stage builds no kernel map, no transposed map and no hash table (CPU; CUDA when present).
"""

from __future__ import annotations

import collections

import pytest
import torch

import kernels.kmap
import models.sparse_tensor
from app.inference.builder import build_pipeline
from app.inference.voxelize import voxelize
from kernels.hashtable import CoordHashTable
from models import SparseTensor
from tests.conftest import load_frame

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
    ),
]


@pytest.fixture
def builds(monkeypatch) -> collections.Counter:
    """Counts every map and hash table built from now on."""
    counts: collections.Counter = collections.Counter()

    def counting(owner, name):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            counts[name] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    counting(models.sparse_tensor, "submanifold_map")
    counting(models.sparse_tensor, "downsample")
    counting(kernels.kmap, "sort_by_out")  # transposed (upsampling) maps
    counting(CoordHashTable, "__init__")  # every hash table
    return counts


@pytest.mark.parametrize("device", DEVICES)
def test_network_builds_no_map_after_the_maps_stage(device, builds):
    pipeline = build_pipeline("random", device, 0.25)
    points = load_frame("semantickitti/seq00_000000.bin")
    batch = voxelize([points], pipeline.voxel_config, "kitti", pipeline.device)

    lazy = SparseTensor(batch.feats, batch.coords, engine=pipeline.engine)
    with torch.no_grad():
        want = pipeline.network(lazy).feats  # no maps stage: layers build what they use
    used = lazy.manager.built()

    x = SparseTensor(batch.feats, batch.coords, engine=pipeline.engine)
    x.manager.prepare(pipeline.map_requests())  # the maps stage
    prepared = x.manager.built()
    builds.clear()
    with torch.no_grad():
        got = pipeline.network(x).feats
    assert not builds, f"the network stage built {dict(builds)}"
    assert x.manager.built() == prepared
    # nothing more, nothing less than the network uses (transposed maps included)
    assert prepared == used
    assert len(prepared["transposed"]) == 4 and any(k[1] == 1 for k in prepared["submanifold"])
    if device == "cpu":  # sorted rows: no level needs a hash table, 1x1 maps included
        assert prepared["tables"] == []
    torch.testing.assert_close(got, want, rtol=0, atol=0)
