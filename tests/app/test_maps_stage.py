"""The maps stage builds every map the network uses and nothing it does not: after it, the
network stage builds no kernel map, no transposed map and no hash table (CPU; CUDA when present).
"""

from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import kernels.kmap
import models.sparse_tensor
from app.inference.builder import build_pipeline
from app.inference.voxelize import voxelize
from kernels import openmp
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


def same_map(a: kernels.kmap.KernelMap, b: kernels.kmap.KernelMap) -> bool:
    return (
        torch.equal(a.in_idx, b.in_idx)
        and torch.equal(a.out_idx, b.out_idx)
        and (a.bounds, a.num_in, a.num_out, a.identity)
        == (b.bounds, b.num_in, b.num_out, b.identity)
    )


def test_two_chains_build_the_maps_one_chain_builds():
    """The maps stage with a helper thread (two chains, each on one OpenMP thread): every level's
    coordinates and every map as one chain makes them; this thread's OpenMP count restored."""
    pipeline = build_pipeline("random", "cpu", 0.25)
    batch = voxelize([load_frame("semantickitti/seq00_000000.bin")], pipeline.voxel_config)
    one = SparseTensor(batch.feats, batch.coords, engine=pipeline.engine).manager
    one.prepare(pipeline.map_requests())
    two = SparseTensor(batch.feats, batch.coords, engine=pipeline.engine).manager
    before = openmp.max_threads()
    with ThreadPoolExecutor(1, initializer=openmp.set_threads_here, initargs=(1,)) as helper:
        assert helper.submit(openmp.max_threads).result() == 1
        two.prepare(pipeline.map_requests(), helper)
    assert openmp.max_threads() == before
    assert two.built() == one.built()
    assert all(torch.equal(two.coords(s), one.coords(s)) for s in one._coords)
    assert all(same_map(two._submanifold[k], m) for k, m in one._submanifold.items())
    for key, made in one._downsampling.items():
        assert same_map(two._downsampling[key].kmap, made.kmap)
        assert same_map(two._downsampling[key].kmap.transposed, made.kmap.transposed)


def test_a_failing_chain_raises_its_error_and_does_not_hang(monkeypatch):
    pipeline = build_pipeline("random", "cpu", 0.25)
    batch = voxelize([load_frame("semantickitti/seq00_000000.bin")], pipeline.voxel_config)
    manager = SparseTensor(batch.feats, batch.coords, engine=pipeline.engine).manager

    def broken(*args, **kwargs):
        raise RuntimeError("no downsampling today")

    monkeypatch.setattr(models.sparse_tensor, "downsample", broken)
    with ThreadPoolExecutor(1) as helper:
        with pytest.raises(RuntimeError, match="no downsampling today"):
            manager.prepare(pipeline.map_requests(), helper)


def test_an_unknown_request_kind_is_named_with_a_helper_too():
    pipeline = build_pipeline("random", "cpu", 0.25)
    batch = voxelize([load_frame("semantickitti/seq00_000000.bin")], pipeline.voxel_config)
    manager = SparseTensor(batch.feats, batch.coords, engine=pipeline.engine).manager
    odd = models.sparse_tensor.MapRequest("sideways", 1, 3)
    with ThreadPoolExecutor(1) as helper:
        with pytest.raises(ValueError, match="unknown map request kind 'sideways'"):
            manager.prepare((*pipeline.map_requests(), odd), helper)


def test_the_shared_queue_hands_out_what_can_be_built_finest_first():
    """_MapQueue: a submanifold map once its level exists (finest level and largest kernel
    first), the upsamplings and anything else once every level is made, then None."""
    manager = SparseTensor(torch.zeros(1, 1), torch.zeros(1, 4, dtype=torch.int32)).manager
    R = models.sparse_tensor.MapRequest
    queue = models.sparse_tensor._MapQueue(
        manager,
        [R("upsample", 2, 2), R("submanifold", 2, 3), R("sideways", 1, 3),
         R("submanifold", 1, 1), R("submanifold", 1, 3)],
    )  # fmt: skip
    assert queue.take() == R("submanifold", 1, 3)
    assert queue.take() == R("submanifold", 1, 1)
    manager.add_level(2, torch.zeros(1, 4, dtype=torch.int32))
    queue.level_made()
    assert queue.take() == R("submanifold", 2, 3)
    queue.all_levels_made()
    assert [queue.take(), queue.take(), queue.take()] == [
        R("upsample", 2, 2), R("sideways", 1, 3), None,
    ]  # fmt: skip


def test_a_builder_waiting_on_the_queue_is_released_when_the_other_fails():
    manager = SparseTensor(torch.zeros(1, 1), torch.zeros(1, 4, dtype=torch.int32)).manager
    queue = models.sparse_tensor._MapQueue(
        manager, [models.sparse_tensor.MapRequest("submanifold", 4, 3)]
    )
    with ThreadPoolExecutor(1) as other:
        waiting = other.submit(queue.take)  # level 4 never comes
        with pytest.raises(RuntimeError, match="lost"):
            with queue.stopping_on_error():
                raise RuntimeError("lost")
        assert waiting.result(timeout=10) is None


@pytest.mark.parametrize("stride", [1, 16])
def test_a_failing_map_on_either_builder_raises_its_error(monkeypatch, stride):
    pipeline = build_pipeline("random", "cpu", 0.25)
    batch = voxelize([load_frame("semantickitti/seq00_000000.bin")], pipeline.voxel_config)
    manager = SparseTensor(batch.feats, batch.coords, engine=pipeline.engine).manager
    original = models.sparse_tensor.submanifold_map

    def broken(coords, *args, **kwargs):
        if coords is manager._coords.get(stride):
            raise RuntimeError(f"no map at level {stride}")
        return original(coords, *args, **kwargs)

    monkeypatch.setattr(models.sparse_tensor, "submanifold_map", broken)
    with ThreadPoolExecutor(1, initializer=openmp.set_threads_here, initargs=(1,)) as helper:
        with pytest.raises(RuntimeError, match=f"no map at level {stride}"):
            manager.prepare(pipeline.map_requests(), helper)
