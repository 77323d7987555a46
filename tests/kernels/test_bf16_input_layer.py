"""kernels/bf16.py: a conv of at most FP32_MAX_CIN input channels (the input layer; 8 is also
the first width of a cr=0.25 network) stays in fp32 under precision bf16; one more channel
runs in bf16."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.bf16 import FP32_MAX_CIN
from kernels.engine import EngineConfig, sparse_conv
from kernels.reference import conv_from_entries, map_entries
from kernels.tuning import GroupingTable
from tests.kernels.kernel_helpers import maps_for, random_cloud

GROUPED = GroupingTable(defaults={"cpu/bf16": (0.3, math.inf, "grouped")})


def worst_error(cin: int, kind: str) -> float:
    kmap = maps_for(random_cloud(500, 6, seed=21))[kind]
    gen = torch.Generator().manual_seed(22)
    x = torch.randn(kmap.num_in, cin, generator=gen)
    w = torch.randn(kmap.kernel_volume, cin, 16, generator=gen) / math.sqrt(cin * 8)
    exact = conv_from_entries(x.double(), w.double(), map_entries(kmap), kmap.num_out)
    with torch.no_grad():
        out = sparse_conv(x, w, kmap, EngineConfig(precision="bf16", grouping=GROUPED))
    return float((out.double() - exact).abs().max() / exact.abs().max())


@pytest.mark.parametrize("kind", ["subm", "down"])
def test_the_input_layer_stays_in_fp32_under_bf16(kind):
    assert FP32_MAX_CIN == 8
    assert worst_error(FP32_MAX_CIN, kind) < 1e-5  # fp32: rounding of the sums only
    assert worst_error(FP32_MAX_CIN + 2, kind) > 1e-4  # bf16 inputs and weights: ~2^-9
