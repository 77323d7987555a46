"""int8 inference (kernels/int8.py, csrc/fused_int8_cpu.cpp) against an fp64 oracle on the same
quantized rows and weights, the per-row quantizer against numpy, and where int8 gives way to its
fallback precision (negative inputs, the tuned choice, a CPU without AVX512_VNNI)."""

import math

import numpy as np
import pytest
import torch

from kernels import precision
from kernels.engine import EngineConfig, sparse_conv
from kernels.int8 import int8_weights, quantize_rows
from kernels.reference import conv_from_entries, map_entries
from kernels.tuning import GroupingTable

from tests.kernels.test_engine import maps_for, random_cloud

INT8 = GroupingTable(defaults={"cpu/int8": (0.0, 0.0, "int8"), "cpu/bf16": (0.0, 0.0, "fused")})
needs_vnni = pytest.mark.skipif(
    precision.fused_int8_lanes() == 0, reason="this CPU has no AVX512_VNNI"
)


def quantized(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The numpy oracle of ls_quantize_rows_u8_cpu: q = rint(x * (255 / row max)) in float32."""
    xn = x.numpy()
    top = xn.max(axis=1)
    inv = np.where(top > 0, np.float32(255) / np.where(top > 0, top, 1), 0).astype(np.float32)
    q = np.clip(np.rint(xn * inv[:, None]), 0, 255).astype(np.uint8)
    return q, (top / np.float32(255)).astype(np.float32)


@needs_vnni
@pytest.mark.parametrize("cols", [4, 16, 20, 32, 48, 64, 192])
def test_rows_quantize_as_numpy_does_bit_for_bit(cols):
    gen = torch.Generator().manual_seed(cols)
    x = torch.rand(300, cols, generator=gen) * torch.logspace(-3, 3, 300)[:, None]
    x[::11] = 0  # rows of zeros: q 0, scale 0
    q, scale = torch.empty(300, cols, dtype=torch.uint8), torch.empty(300)
    assert quantize_rows(x, q, scale)
    want_q, want_scale = quantized(x)
    assert np.array_equal(q.numpy(), want_q) and np.array_equal(scale.numpy(), want_scale)
    # -0.0: its sign bit; rows 7 and 299: in a full batch of 16 rows and in the last, partial one
    for bad in (-1e-30, -0.0, float("nan"), float("inf"), -float("nan")):
        for row in (7, 299):
            y = x.clone()
            y[row, cols - 1] = bad
            assert not quantize_rows(y, q, scale), (bad, row)


def test_weights_quantize_per_offset_and_output_channel():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(27, 16, 32, generator=gen) * torch.linspace(0.01, 3, 32)
    packed, scale = int8_weights(w)
    assert packed.dtype == torch.int8 and packed.shape == (27, 4, 32, 4)
    assert scale.shape == (27, 32)
    q = packed.transpose(2, 3).reshape(27, 16, 32).float()  # packed[k][g][o][j] = q[k][4g+j][o]
    assert q.abs().amax(dim=1).eq(127).all()  # each (offset, output) uses the whole range
    assert (q * scale[:, None, :] - w).abs().le(scale[:, None, :] / 2 * (1 + 1e-6)).all()
    assert int8_weights(w)[0] is packed  # cached until the weight changes
    w.mul_(2)
    assert torch.allclose(int8_weights(w)[1], scale * 2)


def case(kind, cin, cout, seed=21):
    kmap = maps_for(random_cloud(500, 6, seed=seed))[kind]
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(kmap.num_in, cin, generator=gen).relu()  # ReLU outputs, as int8 reads
    w = torch.randn(kmap.kernel_volume, cin, cout, generator=gen) / math.sqrt(cin * 8)
    bias = torch.randn(cout, generator=gen)
    res = torch.randn(kmap.num_out, cout, generator=gen)
    return kmap, x, w, bias, res


def oracle(kmap, x, w, bias, res):
    """fp64 conv of the dequantized rows and weights: what the int32 sums stand for."""
    q, row_scale = quantized(x)
    packed, w_scale = int8_weights(w)
    k, cin, cout = w.shape
    wq = packed.transpose(2, 3).reshape(k, cin, cout).double() * w_scale.double()[:, None, :]
    xq = torch.from_numpy(q).double() * torch.from_numpy(row_scale).double()[:, None]
    out = conv_from_entries(xq, wq, map_entries(kmap), kmap.num_out)
    return torch.relu(out + bias.double() + res.double())


@needs_vnni
@pytest.mark.parametrize("kind", ["subm", "down", "up"])
@pytest.mark.parametrize("cin, cout", [(12, 16), (16, 32), (64, 64), (96, 48), (20, 80)])
def test_fused_int8_sums_int8_products_exactly(kind, cin, cout):
    kmap, x, w, bias, res = case(kind, cin, cout)
    with torch.no_grad():
        out = sparse_conv(
            x, w, kmap, EngineConfig(precision="int8", grouping=INT8), bias, True, res
        )
    # int32 sums are exact; only the fp32 scaling and the fp32 sum over entries round
    torch.testing.assert_close(out.double(), oracle(kmap, x, w, bias, res), rtol=1e-5, atol=1e-5)


@needs_vnni
def test_fused_int8_is_bitwise_reproducible_across_thread_counts():
    kmap, x, w, bias, res = case("subm", 32, 32, seed=5)
    before, outs = torch.get_num_threads(), []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            with torch.no_grad():
                config = EngineConfig(precision="int8", grouping=INT8)
                outs.append(sparse_conv(x, w, kmap, config, bias, True, res))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])


@needs_vnni
@pytest.mark.skipif("int8" not in precision.amx_tiles(), reason="no AMX tiles here")
@pytest.mark.parametrize("kind", ["subm", "down", "up"])
@pytest.mark.parametrize(
    "cin, cout", [(48, 16), (52, 32), (96, 48), (100, 80), (192, 128), (64, 256), (32, 32)]
)
def test_amx_tiles_give_the_bits_of_vnni(kind, cin, cout):
    """The int32 sums are exact either way and the fp32 scaling is one shared function: AMX
    tiles and AVX512_VNNI dot products (tiles off) give the same bits. Tiles take Cin >= 48:
    one chunk, a short last chunk, several, and up to four column passes (Cin 32 stays on
    VNNI either way)."""
    kmap, x, w, bias, res = case(kind, cin, cout)
    config = EngineConfig(precision="int8", grouping=INT8)
    with torch.no_grad():
        before = precision.amx_tile_convs()
        tiles = sparse_conv(x, w, kmap, config, bias, True, res)
        assert precision.amx_tile_convs() == before + (cin >= 48)  # ran on tiles, or not
        with precision.tiles_off():
            vectors = sparse_conv(x, w, kmap, config, bias, True, res)
        assert precision.amx_tile_convs() == before + (cin >= 48)
    assert torch.equal(tiles, vectors)


@needs_vnni
def test_int8_gives_way_to_its_fallback():
    """Negative inputs (the quantizer says so), the input layer (Cin <= 8) and a shape the tuner
    gave to the fallback run exactly as the fallback precision does."""
    kmap, x, w, bias, res = case("subm", 16, 32, seed=9)
    fallback = precision.fallback("int8")
    fb = EngineConfig(precision=fallback, grouping=INT8)
    tuned_away = GroupingTable(
        entries={"cpu/int8/k27/16x32": (0.0, 0.0, "fused")}, defaults=INT8.defaults
    )
    signed = x - 0.5
    narrow = x[:, :8].contiguous()
    with torch.no_grad():
        int8 = EngineConfig(precision="int8", grouping=INT8)
        assert torch.equal(sparse_conv(signed, w, kmap, int8), sparse_conv(signed, w, kmap, fb))
        w8 = w[:, :8].contiguous()
        assert torch.equal(sparse_conv(narrow, w8, kmap, int8), sparse_conv(narrow, w8, kmap, fb))
        away = EngineConfig(precision="int8", grouping=tuned_away)
        assert torch.equal(sparse_conv(x, w, kmap, away), sparse_conv(x, w, kmap, fb))
        assert not torch.equal(sparse_conv(x, w, kmap, int8), sparse_conv(x, w, kmap, fb))


def test_int8_is_offered_where_the_cpu_has_vnni():
    has_vnni = {"AVX512F", "AVX512_VNNI"} <= set(precision.cpu_features())
    assert (precision.fused_int8_lanes() == 16) == has_vnni
    if has_vnni:
        assert precision.offered("int8") == precision.resolve("int8") == "int8"
    else:
        for check in (precision.offered, precision.resolve):
            with pytest.raises(precision.PrecisionError, match="int8 needs AVX512_VNNI"):
                check("int8")
    assert precision.resolve("int8", "cuda") == "fp32"  # CPU-only setting


@needs_vnni
def test_a_conv_reading_the_same_rows_reuses_their_quantization(monkeypatch):
    """conv1 then the 1x1 shortcut of a residual block read one tensor: it is quantized once;
    written in place in between, or another tensor at all, it is quantized again."""
    import kernels.int8 as int8_module

    kmap, x, w, bias, res = case("subm", 32, 32, seed=13)
    w2 = w.flip(0).contiguous()
    calls = []
    real = int8_module.quantize_rows
    monkeypatch.setattr(int8_module, "quantize_rows", lambda *a: calls.append(1) or real(*a))
    config = EngineConfig(precision="int8", grouping=INT8)
    with torch.no_grad():
        first = sparse_conv(x, w, kmap, config)
        second = sparse_conv(x, w2, kmap, config)
        assert len(calls) == 1
        assert torch.equal(second, sparse_conv(x.clone(), w2, kmap, config))  # another tensor
        assert len(calls) == 2
        x.mul_(0.5)  # written in place: its version moves on
        halved = sparse_conv(x, w, kmap, config)
        assert len(calls) == 3
        assert torch.equal(halved, sparse_conv(x.clone(), w, kmap, config))
        assert not torch.equal(halved, first)


@needs_vnni
@pytest.mark.parametrize("kind", ["subm", "down"])
@pytest.mark.parametrize("cin, cout", [(32, 48), (64, 64)])
def test_a_relu_conv_quantizes_its_output_as_the_next_conv_would(monkeypatch, kind, cin, cout):
    """An int8 conv with ReLU (submanifold, or strided: no identity offset) quantizes its output
    in the kernel (after the ReLU, block by block): the next conv reads exactly the bits
    quantize_rows would give it, without calling it, and the output itself is the one a conv
    that does not quantize it gives."""
    import kernels.int8 as int8_module

    kmap, x, w, bias, res = case(kind, cin, cout, seed=17)
    x[::7] = 0  # rows of zeros: scale 0
    if kind == "down":  # the next conv reads the coarse rows: the same map, transposed
        kmap_next, w2 = kmap.transposed, torch.randn(8, cout, 32, generator=torch.Generator())
    else:
        kmap_next, w2 = kmap, torch.randn(27, cout, 32, generator=torch.Generator().manual_seed(3))
    config = EngineConfig(precision="int8", grouping=INT8)
    real_quantize = int8_module.quantize_rows
    calls = []
    monkeypatch.setattr(
        int8_module, "quantize_rows", lambda *a: calls.append(1) or real_quantize(*a)
    )
    with torch.no_grad():
        out = sparse_conv(x, w, kmap, config, bias - 0.5, True, res)  # some rows ReLU'd to 0
        assert len(calls) == 1 and out.eq(0).any() and out.gt(0).any()
        q, scale = int8_module._quantized(out, config.workspace)
        assert len(calls) == 1  # the kernel's own quantization, recorded
        want_q, want_scale = quantized(out)
        assert np.array_equal(q.numpy(), want_q) and np.array_equal(scale.numpy(), want_scale)
        chained = sparse_conv(out, w2, kmap_next, config, None, True)
        assert len(calls) == 1
        monkeypatch.setattr(int8_module, "_made_rows", lambda *a: None)
        assert torch.equal(out, sparse_conv(x, w, kmap, config, bias - 0.5, True, res))
        assert torch.equal(chained, sparse_conv(out.clone(), w2, kmap_next, config, None, True))
