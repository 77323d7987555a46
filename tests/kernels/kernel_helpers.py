"""What the kernel tests share: random clouds and their maps (from test_engine.py), coordinate
tensors and hypothesis clouds (test_kmap.py), the int8 tests' grouping table, skip mark and conv
case (test_int8.py), a residual block's case (test_shortcut.py) and a head's weights
(test_head.py)."""

import math

import pytest
import torch
from hypothesis import strategies as st

from kernels import CoordHashTable, downsample, precision, submanifold_map
from kernels.tuning import GroupingTable


def random_cloud(n, span, seed, batches=2):
    gen = torch.Generator().manual_seed(seed)
    pts = torch.randint(-span, span, (n, 4), generator=gen, dtype=torch.int32)
    pts[:, 0] = pts[:, 0].abs() % batches
    pts = torch.unique(pts, dim=0)
    return pts[torch.randperm(len(pts), generator=gen)].contiguous()


def maps_for(coords):
    table = CoordHashTable.build(coords)
    sub = submanifold_map(coords, table, 3)
    _, _, down = downsample(coords, table, 2, 2)
    return {"subm": sub, "down": down, "up": down.transposed}


def coords_tensor(rows, device="cpu"):
    return torch.tensor(rows, dtype=torch.int32, device=device).reshape(-1, 4)


@st.composite
def clouds(draw, max_points=40, span=4):
    n = draw(st.integers(0, max_points))
    pts = draw(
        st.lists(
            st.tuples(
                st.integers(0, 2),
                st.integers(-span, span),
                st.integers(-span, span),
                st.integers(-span, span),
            ),
            min_size=n,
            max_size=n,
            unique=True,
        )
    )
    return coords_tensor(pts) if pts else torch.zeros(0, 4, dtype=torch.int32)


INT8 = GroupingTable(defaults={"cpu/int8": (0.0, 0.0, "int8"), "cpu/bf16": (0.0, 0.0, "fused")})
needs_vnni = pytest.mark.skipif(
    precision.fused_int8_lanes() == 0, reason="this CPU has no int8 kernel (AVX2)"
)


def case(kind, cin, cout, seed=21):
    kmap = maps_for(random_cloud(500, 6, seed=seed))[kind]
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(kmap.num_in, cin, generator=gen).relu()  # ReLU outputs, as int8 reads
    w = torch.randn(kmap.kernel_volume, cin, cout, generator=gen) / math.sqrt(cin * 8)
    bias = torch.randn(cout, generator=gen)
    res = torch.randn(kmap.num_out, cout, generator=gen)
    return kmap, x, w, bias, res


def block_case(cin_sc: int):
    """conv2's map and weights, its input made by an int8 conv (so on record), and a shortcut
    input, weight, bias and 1x1 map on the same rows."""
    kmap, x0, w0, b0, _ = case("subm", 48, 48, seed=41)
    gen = torch.Generator().manual_seed(2)
    w, bias = torch.randn(27, 48, 64, generator=gen) / 20, torch.randn(64, generator=gen)
    xs = torch.rand(kmap.num_in, cin_sc, generator=gen)
    ws, bs = torch.randn(1, cin_sc, 64, generator=gen) / 10, torch.randn(64, generator=gen)
    one = submanifold_map(random_cloud(500, 6, seed=41), None, 1)
    return kmap, (x0, w0, b0), w, bias, (xs, ws, bs, one)


def a_head(features: int, classes: int = 19, seed: int = 5):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(classes, features, generator=gen), torch.randn(classes, generator=gen)
