"""bf16 inference (kernels/bf16.py, csrc/fused_bf16_cpu.cpp) against an fp64 oracle on the same
bf16-rounded inputs and weights, and how the precision is chosen (kernels/precision.py)."""

import math

import pytest
import torch

from kernels import amx, precision
from kernels.bf16 import bf16_weights, rows_under_cap_bf16
from kernels.engine import EngineConfig, sparse_conv
from kernels.reference import conv_from_entries, map_entries
from kernels.tuning import GroupingTable

from tests.kernels.kernel_helpers import maps_for, random_cloud

FUSED = GroupingTable(defaults={"cpu/bf16": (0.0, 0.0, "fused")})
GROUPED = GroupingTable(defaults={"cpu/bf16": (0.3, math.inf, "grouped")})
needs_bf16_cpu = pytest.mark.skipif(
    precision.fused_bf16_lanes() == 0, reason="this CPU has no AVX512_BF16"
)
needs_amx = pytest.mark.skipif(
    "bf16" not in amx.amx_tiles(), reason="no AMX tiles here (CPU or Linux)"
)


def case(kind, cin, cout, seed=21):
    kmap = maps_for(random_cloud(500, 6, seed=seed))[kind]
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(kmap.num_in, cin, generator=gen)
    w = torch.randn(kmap.kernel_volume, cin, cout, generator=gen) / math.sqrt(cin * 8)
    bias = torch.randn(cout, generator=gen)
    res = torch.randn(kmap.num_out, cout, generator=gen)
    rounded = conv_from_entries(
        x.bfloat16().double(), w.bfloat16().double(), map_entries(kmap), kmap.num_out
    )
    return kmap, x, w, bias, res, torch.relu(rounded + bias.double() + res.double())


@needs_bf16_cpu
@pytest.mark.parametrize("kind", ["subm", "down", "up"])
@pytest.mark.parametrize("cin, cout", [(10, 16), (16, 32), (64, 64), (96, 48), (30, 80)])
def test_fused_bf16_sums_bf16_products_in_fp32(kind, cin, cout):
    kmap, x, w, bias, res, expected = case(kind, cin, cout)
    config = EngineConfig(precision="bf16", grouping=FUSED)
    with torch.no_grad():
        out = sparse_conv(x, w, kmap, config, bias, True, res)
    assert out.dtype == torch.float32
    # products of bf16 values are exact in fp32; only the fp32 sums round
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    # and it is not the fp32 path: rounding the inputs moves the result
    with torch.no_grad():
        fp32 = sparse_conv(x, w, kmap, EngineConfig(grouping=FUSED), bias, True, res)
    assert not torch.equal(out, fp32)


@needs_bf16_cpu
@pytest.mark.parametrize("special", ["finite", "inf and nan"])
def test_fused_bf16_rounds_its_input_as_torch_does(special):
    """The kernel rounds the fp32 rows to bf16 itself: the same bits as torch's rounding, so the
    conv of x and of x already rounded by torch are the same: ties to even (both ways), a value
    that rounds up into the next binade, a tiny one; infinities and NaN stay. (Values of similar
    size only: a huge one would absorb the others' rounding in every sum it reaches.)"""
    kmap, x, w, bias, res, _ = case("subm", 32, 32, seed=9)
    if special == "finite":
        ulp = 2.0**-7  # of bf16 at 1.0
        values = [1 + ulp / 2, 1 + 1.5 * ulp, -(1 + 1.5 * ulp), 2 - ulp / 4, 1e-30]
    else:
        values = [float("inf"), float("-inf"), float("nan"), 1.0]
    x[0, : len(values)] = torch.tensor(values)
    config = EngineConfig(precision="bf16", grouping=FUSED)
    with torch.no_grad():
        out = sparse_conv(x, w, kmap, config, bias, False, res)
        rounded = sparse_conv(x.bfloat16().float(), w, kmap, config, bias, False, res)
    assert torch.equal(out.isnan(), rounded.isnan())
    assert out.isnan().any().item() == (special != "finite")
    assert torch.equal(out.nan_to_num(), rounded.nan_to_num())


@needs_amx
@pytest.mark.parametrize("kind", ["subm", "down", "up"])
@pytest.mark.parametrize("cin, cout", [(10, 16), (16, 32), (96, 48), (30, 80), (192, 128)])
def test_amx_tiles_sum_the_same_bf16_products(kind, cin, cout):
    """On AMX tiles and on AVX512_BF16 dot products (tiles off) the fused conv sums the same
    products in fp32, only in another order: both at the oracle."""
    kmap, x, w, bias, res, expected = case(kind, cin, cout)
    config = EngineConfig(precision="bf16", grouping=FUSED)
    with torch.no_grad():
        before = amx.amx_tile_convs()
        tiles = sparse_conv(x, w, kmap, config, bias, True, res)
        assert amx.amx_tile_convs() == before + 1  # it ran on tiles
        with amx.tiles_off():
            assert amx.amx_tiles() == ()
            vectors = sparse_conv(x, w, kmap, config, bias, True, res)
        assert amx.amx_tile_convs() == before + 1
    assert "bf16" in amx.amx_tiles()  # back on
    for out in (tiles, vectors):
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_amx_tiles_are_reported_only_where_the_cpu_has_them():
    on = amx.amx_tiles()
    assert set(on) <= {"int8", "bf16"}
    if "AMX_TILE" not in precision.cpu_features():
        assert on == ()
    if on == ():
        assert amx.amx_tile_convs() == 0
    with pytest.raises(ValueError, match="-1, 0 or 1"):
        amx.amx_tiles(2)
    assert amx.amx_tiles() == on


@needs_bf16_cpu
def test_fused_bf16_is_bitwise_reproducible_across_thread_counts():
    kmap, x, w, bias, res, _ = case("subm", 32, 32, seed=5)
    config = EngineConfig(precision="bf16", grouping=FUSED)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            with torch.no_grad():
                outs.append(sparse_conv(x, w, kmap, config, bias, True, res))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("kind", ["subm", "down", "up"])
@pytest.mark.parametrize("cin, cout", [(16, 32), (9, 12)])
def test_grouped_bf16_matches_oracle(kind, cin, cout):
    # torch's bf16 matmul rounds each launch's partial sums to bf16: a looser bound
    kmap, x, w, bias, res, expected = case(kind, cin, cout)
    with torch.no_grad():
        out = sparse_conv(
            x, w, kmap, EngineConfig(precision="bf16", grouping=GROUPED), bias, True, res
        )
    torch.testing.assert_close(out.double(), expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kind", ["subm", "down", "up"])
def test_grouped_bf16_stays_under_the_memory_cap(kind):
    # a cap of 13 buffer rows splits every launch; the result still matches the oracle and the
    # unchunked run, and no scratch buffer holds more than the cap's rows (plus the 25% slack)
    cin, cout, rows = 16, 32, 13
    kmap, x, w, bias, res, expected = case(kind, cin, cout)
    tiny = EngineConfig(
        precision="bf16", grouping=GROUPED, memory_cap=rows_under_cap_bytes(rows, cin, cout)
    )
    whole = EngineConfig(precision="bf16", grouping=GROUPED)
    with torch.no_grad():
        out = sparse_conv(x, w, kmap, tiny, bias, True, res)
        ref = sparse_conv(x, w, kmap, whole, bias, True, res)
    torch.testing.assert_close(out.double(), expected, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out, ref, rtol=1e-2, atol=1e-2)
    buffers = tiny.workspace._local.buffers
    for slot, cols in ((3, cin), (4, cout), (5, cout)):
        flat = buffers[(slot, torch.float32 if slot == 5 else torch.bfloat16, x.device)]
        assert flat.numel() <= rows * 5 // 4 * cols, (slot, flat.numel())


def rows_under_cap_bytes(rows: int, cin: int, cout: int) -> int:
    """The cap that leaves exactly `rows` buffer rows to the bf16 grouped path."""
    assert rows_under_cap_bf16(rows * (2 * cin + 6 * cout), cin, cout) == rows
    return rows * (2 * cin + 6 * cout)


def test_weight_conversion_is_cached_until_the_weight_changes():
    w = torch.randn(27, 4, 16)
    plain, pairs = bf16_weights(w)
    assert bf16_weights(w)[0] is plain
    assert torch.equal(pairs[:, 1, :, 0], plain[:, 2, :])  # pairs[k][p][o][j] = w[k][2p+j][o]
    assert torch.equal(pairs[:, 1, :, 1], plain[:, 3, :])
    w.mul_(2)
    assert torch.equal(bf16_weights(w)[0], (w.bfloat16()))


def test_precision_names():
    assert precision.resolve("fp32") == "fp32"
    assert precision.resolve("auto") in precision.RUNNABLE
    assert precision.resolve(None) == precision.resolve("auto")
    assert precision.resolve("bf16", "cuda") == "fp32"  # CPU-only setting
    with pytest.raises(precision.PrecisionError, match="unknown precision"):
        precision.resolve("fp8")


def test_bf16_is_offered_where_the_cpu_multiplies_it_natively():
    """bf16 needs AVX512_BF16 or AMX_BF16; elsewhere torch emulates it, about 27x slower than
    fp32 on one core of a Zen 1 (kernels/precision.py), and it is refused like int8 without VNNI."""
    features = set(precision.cpu_features())
    native = bool({"AVX512_BF16", "AMX_BF16"} & features)
    assert precision.native_bf16() == native
    if native:
        assert precision.offered("bf16") == precision.resolve("bf16") == "bf16"
    else:
        for check in (precision.offered, precision.resolve):
            with pytest.raises(
                precision.PrecisionError, match="bf16 needs AVX512_BF16 or AMX_BF16"
            ):
                check("bf16")
    assert precision.resolve("bf16", "cuda") == "fp32"  # CPU-only setting


def test_auto_follows_the_cpu_features():
    features = precision.cpu_features()
    if "AVX512_BF16" in features:
        assert precision.fused_bf16_lanes() == 16
    if "AVX2" in features:  # every int8 kernel needs AVX2, and auto takes each
        assert precision.resolve("auto") == "int8"
    elif "AVX512_BF16" in features or "AMX_BF16" in features:
        assert precision.resolve("auto") == "bf16"
    else:
        assert precision.resolve("auto") == "fp32"


def test_tiles_running_names_the_running_precision_and_its_fallback(monkeypatch):
    """/v1/model's amx_tiles: on an AMX CPU int8 and its bf16 fallback, never fp32's."""
    expected = ["int8", "bf16"] if "AMX_INT8" in precision.cpu_features() else []
    assert precision.tiles_running("int8") == [p for p in amx.amx_tiles() if p in expected]
    assert precision.tiles_running("fp32") == []
    monkeypatch.setattr(precision, "amx_tiles", lambda: ("int8", "bf16"))
    monkeypatch.setattr(precision, "native_bf16", lambda: True)
    assert precision.tiles_running("int8") == ["int8", "bf16"]
    assert precision.tiles_running("bf16") == ["bf16"]
    assert precision.tiles_running("fp32") == []
    monkeypatch.setattr(precision, "native_bf16", lambda: False)  # int8 falls back to fp32
    assert precision.tiles_running("int8") == ["int8"]


def test_grouping_table_has_a_precision_dimension():
    table = GroupingTable.from_json(
        {
            "version": 1,
            "defaults": {
                "cpu": {"epsilon": 0.0, "S": 0, "dataflow": "fused"},
                "cpu/bf16": {"epsilon": 0.3, "S": "inf", "dataflow": "grouped"},
            },
            "entries": {"cpu/bf16/k27/64x64": {"epsilon": 0.1, "S": 0, "dataflow": "fused"}},
        }
    )
    assert table.choose("cpu", 27, 64, 64) == (0.0, 0.0, "fused")
    assert table.choose("cpu", 27, 64, 64, "bf16") == (0.1, 0.0, "fused")
    assert table.choose("cpu", 27, 32, 32, "bf16") == (0.1, 0.0, "fused")  # nearest shape
    assert table.choose("cpu", 8, 32, 32, "bf16") == (0.3, math.inf, "grouped")  # default
