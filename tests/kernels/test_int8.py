"""int8 inference (kernels/int8.py, csrc/fused_int8_cpu.cpp) against an fp64 oracle on the same
quantized rows and weights, the per-row quantizer against numpy, and where int8 gives way to its
fallback precision (negative inputs, the tuned choice), and the int8 kernels against each other."""

import numpy as np
import pytest
import torch

from kernels import amx, precision
from kernels.engine import EngineConfig, sparse_conv
from kernels.int8 import int8_weights, pack_weight, quantize_rows, quantize_weight
from kernels.reference import conv_from_entries, map_entries
from kernels.tuning import GroupingTable

from tests.kernels.kernel_helpers import INT8, case, needs_vnni


def quantized(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The numpy oracle of ls_quantize_rows_u8_cpu: q = rint(x * (255 / row max)) in float32."""
    xn = x.numpy()
    top = xn.max(axis=1)
    inv = np.where(top > 0, np.float32(255) / np.where(top > 0, top, 1), 0).astype(np.float32)
    q = np.clip(np.rint(xn * inv[:, None]), 0, 255).astype(np.uint8)
    return q, (top / np.float32(255)).astype(np.float32)


@pytest.mark.parametrize("kernel", ["avx2", "avx512_vnni"])  # AVX_VNNI's is AVX2's
@pytest.mark.parametrize("cols", [4, 16, 20, 32, 48, 64, 192])
def test_rows_quantize_as_numpy_does_bit_for_bit(kernel, cols):
    if kernel not in runnable_kernels():
        pytest.skip(f"this CPU has no {kernel}")
    with precision.int8_kernel_set(kernel):
        rows_quantize_as_numpy_does(cols)


def rows_quantize_as_numpy_does(cols):
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
    q, scale = quantize_weight(w)
    assert q.dtype == torch.int8 and q.shape == (27, 16, 32) and scale.shape == (27, 32)
    assert q.abs().amax(dim=1).eq(127).all()  # each (offset, output) uses the whole range
    err = (q.float() * scale[:, None, :] - w).abs()
    assert err.le(scale[:, None, :] / 2 * (1 + 1e-6)).all()
    packed, _ = int8_weights(w)
    assert int8_weights(w)[0] is packed  # cached until the weight changes
    w.mul_(2)
    assert torch.allclose(int8_weights(w)[1], scale * 2)


@pytest.mark.parametrize("group", [4, 2])
def test_weights_pack_as_the_kernels_read_them(group):
    """packed[k][g][o][j] = q[k][group g + j][o]: int8 quads, or int16 pairs (AVX2) as bytes."""
    q = torch.randint(-127, 128, (3, 8, 16), dtype=torch.int8)
    packed, _ = pack_weight(q, torch.ones(3, 16), group)
    assert packed.dtype == torch.int8 and packed.shape == (3, 8 // group, 16, 4)
    values = packed if group == 4 else packed.view(torch.int16)  # little-endian pairs
    for k, g, o, j in [(0, 0, 0, 0), (1, 1, 5, 1), (2, 8 // group - 1, 15, group - 1)]:
        assert values[k, g, o, j] == q[k, group * g + j, o]


def oracle(kmap, x, w, bias, res):
    """fp64 conv of the dequantized rows and weights: what the int32 sums stand for."""
    q, row_scale = quantized(x)
    wq, w_scale = quantize_weight(w)
    wq = wq.double() * w_scale.double()[:, None, :]
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
@pytest.mark.skipif("int8" not in amx.amx_tiles(), reason="no AMX tiles here")
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
        before = amx.amx_tile_convs()
        tiles = sparse_conv(x, w, kmap, config, bias, True, res)
        assert amx.amx_tile_convs() == before + (cin >= 48)  # ran on tiles, or not
        with amx.tiles_off():
            vectors = sparse_conv(x, w, kmap, config, bias, True, res)
        assert amx.amx_tile_convs() == before + (cin >= 48)
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


# each int8 kernel and the /proc/cpuinfo flags (precision.FEATURE_FLAGS names) it needs
KERNEL_FEATURES = {
    "avx2": {"AVX2"},
    "avx_vnni": {"AVX2", "AVX_VNNI"},
    "avx512_vnni": {"AVX512F", "AVX512_VNNI"},
}


def runnable_kernels() -> list[str]:
    features = set(precision.cpu_features())
    return [name for name, needs in KERNEL_FEATURES.items() if needs <= features]


def test_the_widest_int8_kernel_the_cpu_has_runs_and_auto_takes_the_fast_ones():
    kernels = runnable_kernels()
    best = kernels[-1] if kernels else "none"
    assert precision.int8_kernel() == best  # the library's CPUID agrees with /proc/cpuinfo
    assert precision.fused_int8_lanes() == {"none": 0, "avx512_vnni": 16}.get(best, 8)
    if kernels:
        assert precision.offered("int8") == precision.resolve("int8") == "int8"
        assert precision.resolve("auto") == "int8"  # every kernel beat fp32 where measured
    else:
        for check in (precision.offered, precision.resolve):
            with pytest.raises(precision.PrecisionError, match="int8 needs AVX2"):
                check("int8")
    assert precision.resolve("int8", "cuda") == "fp32"  # CPU-only setting


def test_a_kernel_the_cpu_lacks_is_refused_and_none_refuses_int8():
    missing = [name for name in KERNEL_FEATURES if name not in runnable_kernels()]
    for name in missing:
        with pytest.raises(ValueError, match=f"cannot run the {name} int8 kernel"):
            precision.int8_kernel(name)
    with pytest.raises(ValueError, match="unknown int8 kernel"):
        precision.int8_kernel("sse2")
    best = precision.int8_kernel()
    with precision.int8_kernel_set("none"):
        assert precision.fused_int8_lanes() == 0
        with pytest.raises(precision.PrecisionError, match="int8 needs AVX2"):
            precision.resolve("int8")
    assert precision.int8_kernel() == best


@needs_vnni
@pytest.mark.parametrize("kernel", list(KERNEL_FEATURES))
@pytest.mark.parametrize("kind", ["subm", "down", "up"])
@pytest.mark.parametrize("cin, cout", [(12, 16), (64, 64), (20, 80), (96, 48)])
def test_every_int8_kernel_gives_the_bits_of_the_widest(kernel, kind, cin, cout):
    """Exact int32 sums and the same fp32 scaling: the 256-bit kernels (AVX_VNNI, AVX2) give
    the AVX-512 kernel's bits (and each other's), stores, adds, bias and residual alike."""
    if kernel not in runnable_kernels():
        pytest.skip(f"this CPU has no {kernel}")
    widest = runnable_kernels()[-1]
    if kernel == widest:
        pytest.skip("nothing narrower to compare with")
    kmap, x, w, bias, res = case(kind, cin, cout, seed=cin + cout)
    config = EngineConfig(precision="int8", grouping=INT8)
    outs = []
    with torch.no_grad():
        for name in (widest, kernel):
            with precision.int8_kernel_set(name):
                outs.append(sparse_conv(x, w, kmap, config, bias, True, res))
    assert torch.equal(outs[0], outs[1])


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
