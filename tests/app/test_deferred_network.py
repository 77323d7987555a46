"""The network stage with its kernel calls deferred (kernels/deferred.py; the pipeline's
network stage) against the same stage with every call run as it is made: the same bits on real
frames in every CPU precision, the frame run again where a conv could not do what was assumed
of it, and deferral only for networks whose layers allow it."""

import math

import numpy as np
import pytest
import torch

from app.inference.builder import load_model, pipeline_for
from app.inference.voxelize import voxelize
from kernels import deferred
from kernels.precision import fused_int8_lanes, native_bf16
from kernels.tuning import GroupingTable
from models import EngineConfig, SparseTensor
from models.fold import fold_batchnorm, runs_deferred
from models.minkunet import MinkUNet
from models.spunet import SpUNet
from tests.conftest import FIELDS, require_real_data

KITTI = "semantickitti/seq00_000000.bin"
NUSCENES = "nuscenes/n015-2018-07-24-11-22-45+0800__LIDAR_TOP__1532402927647951.pcd.bin"
OUSTER = "ouster/os1-128_lb_n3_scan0_xyzr.bin"
NEEDS_INT8 = pytest.mark.skipif(not fused_int8_lanes(), reason="this CPU has no int8 kernel (AVX2)")
NEEDS_BF16 = pytest.mark.skipif(
    not native_bf16(), reason="no AVX512_BF16 or AMX_BF16: bf16 refused"
)


def points_of(rel: str) -> tuple[np.ndarray, str]:
    raw = np.fromfile(require_real_data() / rel, dtype=np.float32)
    sensor = rel.split("/")[0]
    return raw.reshape(-1, FIELDS[rel]), sensor if sensor in ("nuscenes", "ouster") else "kitti"


@pytest.fixture(scope="module")
def default_model():
    return load_model("default")


def network_stage(pipe, rel: str, defer: bool):
    """(logits or None, classes or None) of the network stage on a frame whose maps are built."""
    points, sensor = points_of(rel)
    batch = voxelize([points], pipe.voxel_config, sensor, pipe.device)
    x = SparseTensor(batch.feats, batch.coords, engine=pipe.engine)
    x.manager.prepare(pipe.map_requests())
    pipe.defer_calls = defer
    with torch.no_grad():
        return pipe.network_stage(x)


def assert_same(got, expected):
    for a, b in zip(got, expected):
        assert (a is None) == (b is None)
        if a is not None:  # logits (NaN where a row's sums are) or classes
            assert torch.equal(a.isnan(), b.isnan())
            assert torch.equal(a.nan_to_num(), b.nan_to_num())


@pytest.mark.parametrize(
    "precision",
    ["fp32", pytest.param("bf16", marks=NEEDS_BF16), pytest.param("int8", marks=NEEDS_INT8)],
)
@pytest.mark.parametrize("first, frame", [(KITTI, NUSCENES), (NUSCENES, OUSTER), (OUSTER, KITTI)])
def test_deferred_calls_give_the_same_bits(default_model, precision, first, frame):
    """The reference runs in a pipeline of its own first; then the pipeline under test runs
    another frame call by call, so its buffers and the memory torch hands out hold that frame's
    rows: a deferred conv whose rows torch read before the kernel ran would read those."""
    model, meta = default_model
    reference = network_stage(pipeline_for(model, meta, "cpu", precision=precision), frame, False)
    pipe = pipeline_for(model, meta, "cpu", precision=precision)
    assert pipe.defer_calls
    network_stage(pipe, first, False)
    assert_same(network_stage(pipe, frame, True), reference)


# dataflows the default tuning does not give these shapes here: torch's matmuls (grouped) read
# rows that deferred kernels made, and in int8 the decoder's concatenations and the blocks'
# first outputs are made for bf16 convs (stand-ins made on use)
TABLES = {  # fused kernels for some kernel sizes, torch's matmuls for the others
    "fp32": GroupingTable(
        entries={"cpu/k8/64x64": (0.0, 0.0, "fused")},
        defaults={"cpu": (0.3, math.inf, "grouped")},
    ),
    "bf16": GroupingTable(
        entries={"cpu/bf16/k27/64x64": (0.0, 0.0, "fused")},
        defaults={"cpu/bf16": (0.3, math.inf, "grouped")},
    ),
    "int8": GroupingTable(
        entries={"cpu/int8/k8/64x64": (0.0, 0.0, "int8")},
        defaults={"cpu/int8": (0.0, 0.0, "fused"), "cpu/bf16": (0.0, 0.0, "fused")},
    ),
}


@pytest.mark.parametrize("precision", TABLES)
def test_torch_reads_rows_only_once_their_kernels_ran(default_model, precision):
    if precision == "bf16" and not native_bf16():
        pytest.skip("no AVX512_BF16 or AMX_BF16: bf16 refused")
    model, meta = default_model
    pipes = [
        pipeline_for(
            model, meta, "cpu", engine=EngineConfig(precision=precision, grouping=TABLES[precision])
        )
        for _ in range(2)
    ]
    reference = network_stage(pipes[0], KITTI, False)
    pipe = pipes[1]
    network_stage(pipe, NUSCENES, False)
    assert_same(network_stage(pipe, KITTI, True), reference)


@NEEDS_INT8
def test_a_conv_whose_rows_cannot_be_quantized_runs_the_frame_again(default_model, monkeypatch):
    """An infinite bias makes an int8 conv's ReLU rows infinite: its quantization fails, which
    the deferred run assumed it would not. It raises AssumptionFailed once the calls ran, and the
    stage runs again call by call: the same result as running it so from the start."""
    model, meta = default_model
    pipe = pipeline_for(model, meta, "cpu", precision="int8")
    conv = pipe.network.encoder[2].blocks[0].conv1
    with torch.no_grad():
        conv.bias[3] = float("inf")
    failed = []
    settle = deferred.settle

    def spy():
        try:
            settle()
        except deferred.AssumptionFailed:
            failed.append(True)
            raise

    monkeypatch.setattr(deferred, "settle", spy)
    eager = network_stage(pipe, KITTI, False)
    assert not failed
    again = network_stage(pipe, KITTI, True)
    assert failed == [True]
    assert_same(again, eager)


def test_only_networks_whose_layers_allow_it_defer(default_model):
    model, _ = default_model
    assert runs_deferred(fold_batchnorm(model))
    assert not runs_deferred(model)  # unfolded: BatchNorm and ReLU read the rows themselves
    assert not runs_deferred(fold_batchnorm(SpUNet()))  # another network's forward
    assert not runs_deferred(torch.nn.Sequential(MinkUNet()))


@NEEDS_INT8
def test_a_conv_that_reads_negative_rows_sees_the_quantizer_s_flag(default_model):
    """Without its ReLU, a block's first conv hands the second rows with negative values: the
    second quantizes them itself (the call waits), reads the quantizer's flag (the wait ends
    there) and runs in bf16 instead, as it does call by call."""
    model, meta = default_model
    reference = pipeline_for(model, meta, "cpu", precision="int8")
    pipe = pipeline_for(model, meta, "cpu", precision="int8")
    for p in (reference, pipe):
        p.network.encoder[2].blocks[0].conv1.relu = False
    expected = network_stage(reference, KITTI, False)
    network_stage(pipe, NUSCENES, False)
    assert_same(network_stage(pipe, KITTI, True), expected)
