"""torchsparse kernel order (models/torchsparse_compat.py) against an independent oracle: convs
imported from torchsparse layouts, computed by hand from torchsparse's offset enumeration."""

from __future__ import annotations

import pytest
import torch

from models import SparseInverseConv3d, SparseTensor
from models.importers import export_state_dict, import_model
from models.torchsparse_compat import weight_from_torchsparse, weight_to_torchsparse
from tests.conftest import ours_threads
from tests.models.checkpoint_helpers import CFG, random_cloud, random_minkunet


@pytest.fixture(scope="module")
def model():
    return random_minkunet()


# ---- torchsparse kernel order against an independent oracle -----------------------------------
# torchsparse (nn/utils/kernel.py get_kernel_offsets): per-axis offsets arange(-K//2+1, K//2+1);
# odd K^3 lists [x, y, z] for z, then y, then x innermost (x fastest); even K^3 lists them for x,
# then y, then z innermost. The oracle below indexes a torchsparse kernel by that list only.


def _ts_offsets(k: int) -> list[tuple[int, int, int]]:
    r = list(range(-k // 2 + 1, k // 2 + 1))
    if k**3 % 2 == 1:
        return [(x, y, z) for z in r for y in r for x in r]
    return [(x, y, z) for x in r for y in r for z in r]


def _one_offset_kernel(k: int, offset, cin: int, cout: int, seed: int):
    """torchsparse-layout kernel, zero except at `offset`; returns (kernel, that matrix)."""
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(cin, cout, generator=g)
    w = torch.zeros(k**3, cin, cout)
    w[_ts_offsets(k).index(tuple(offset))] = m
    return w, m


def _rows(coords: torch.Tensor) -> dict[tuple[int, ...], int]:
    return {tuple(c): i for i, c in enumerate(coords.tolist())}


def test_torchsparse_offsets_are_asymmetric_enough():
    """The chosen offsets would land elsewhere under the other enumeration order, so a wrong
    axis order cannot pass the oracle tests."""
    r3 = [(a - 1, b - 1, c - 1) for a in range(3) for b in range(3) for c in range(3)]  # ours
    assert r3[_ts_offsets(3).index((1, 0, -1))] != (1, 0, -1)
    r2 = [(z, y, x) for x in range(2) for y in range(2) for z in range(2)]  # reversed
    assert r2[_ts_offsets(2).index((1, 1, 0))] != (1, 1, 0)


def test_torchsparse_subm_kernel_order_oracle(model):
    """SPVNAS stem conv (K = 3) with one non-zero offset d: out[q] = in[q + d] @ M."""
    d = (1, 0, -1)
    ref = export_state_dict(model.state_dict(), "torchsparse-spvnas", CFG)
    cs0 = CFG.channels[0]
    ref["stem.0.kernel"], m = _one_offset_kernel(3, d, 4, cs0, seed=3)
    imported = import_model(ref, "torchsparse-spvnas", CFG)
    coords, feats = random_cloud(seed=4)
    with torch.no_grad(), ours_threads():
        out = imported.stem[0][0](SparseTensor(feats, coords)).feats
    rows = _rows(coords)
    expected = torch.zeros(len(coords), cs0)
    for i, (b, x, y, z) in enumerate(coords.tolist()):
        j = rows.get((b, x + d[0], y + d[1], z + d[2]))
        if j is not None:
            expected[i] = feats[j] @ m
    assert (expected != 0).any(dim=1).sum() > 10  # the offset actually hits neighbours
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_torchsparse_down_kernel_order_oracle(model):
    """mmdet3d-torchsparse encoder[0] down conv (K = 2, stride 2), one offset d:
    out[p] = in[2p + d] @ M."""
    d = (1, 1, 0)
    ref = export_state_dict(model.state_dict(), "torchsparse-mmdet3d", CFG)
    cs0 = CFG.channels[0]
    ref["backbone.encoder.0.0.net.0.kernel"], m = _one_offset_kernel(2, d, cs0, cs0, seed=5)
    imported = import_model({"state_dict": ref}, "torchsparse-mmdet3d", CFG)
    coords, _ = random_cloud(seed=6)
    feats = torch.randn(len(coords), cs0, generator=torch.Generator().manual_seed(7))
    with torch.no_grad(), ours_threads():
        y = imported.encoder[0].down[0](SparseTensor(feats, coords))
    rows = _rows(coords)
    expected = torch.zeros(len(y.coords), cs0)
    for i, (b, x, yy, z) in enumerate(y.coords.tolist()):
        j = rows.get((b, 2 * x + d[0], 2 * yy + d[1], 2 * z + d[2]))
        if j is not None:
            expected[i] = feats[j] @ m
    assert (expected != 0).any(dim=1).sum() > 10
    torch.testing.assert_close(y.feats, expected, rtol=1e-5, atol=1e-5)


def test_torchsparse_transposed_kernel_order_oracle(model):
    """Up conv (torchsparse transposed Conv3d, K = 2), one offset d: out[q] = in[p] @ M for the
    fine q = 2p + d, zero for the other fine rows."""
    d = (0, 1, 1)
    coords, feats = random_cloud(seed=8)
    down = model.encoder[0].down[0]
    cs0 = CFG.channels[0]
    feats = torch.randn(len(coords), cs0, generator=torch.Generator().manual_seed(9))
    w, m = _one_offset_kernel(2, d, cs0, 5, seed=10)
    up = SparseInverseConv3d(cs0, 5, 2)
    with torch.no_grad():
        up.weight.copy_(weight_from_torchsparse(w))
        with ours_threads():
            coarse = down(SparseTensor(feats, coords))
            fine = up(coarse)
    assert torch.equal(fine.coords, coords)
    rows = _rows(coarse.coords)
    expected = torch.zeros(len(coords), 5)
    for i, (b, x, y, z) in enumerate(coords.tolist()):
        if (x % 2, y % 2, z % 2) == d:
            expected[i] = coarse.feats[rows[(b, x // 2, y // 2, z // 2)]] @ m
    assert (expected != 0).any(dim=1).sum() > 10
    torch.testing.assert_close(fine.feats, expected, rtol=1e-5, atol=1e-5)


def test_torchsparse_weight_helpers():
    w = torch.randn(27, 2, 3)
    assert torch.equal(weight_to_torchsparse(weight_from_torchsparse(w)), w)
    assert not torch.equal(weight_from_torchsparse(w), w)
    w2 = torch.randn(8, 2, 3)
    assert torch.equal(weight_from_torchsparse(w2), w2)  # even K: same order
    w1 = torch.randn(2, 3)
    assert weight_from_torchsparse(w1).shape == (1, 2, 3)
    assert torch.equal(weight_to_torchsparse(weight_from_torchsparse(w1)), w1)
    with pytest.raises(ValueError):
        weight_from_torchsparse(torch.randn(26, 2, 3))
