"""The stand-ins never made (kernels/concat.py). The decoder's concatenation: quantizing its two
parts side by side is quantizing the concatenation, bit for bit; convs on a RowConcat give what
they give on the tensor, in int8 and in the precisions that make the tensor; anything else that
touches it gets the tensor. A residual block's first conv kept only quantized (UnkeptOutput):
the next conv gives the bits it gives on the fp32 output, which is made, the same bits, when
something asks for it."""

import contextlib

import pytest
import torch

from kernels import amx
from kernels.concat import RowConcat, UnkeptOutput, concat_rows
from kernels.engine import EngineConfig, sparse_conv
from kernels.int8 import quantize_rows

from tests.kernels.kernel_helpers import INT8, case, needs_vnni


def parts(n=400, ca=48, cb=16, seed=3):
    gen = torch.Generator().manual_seed(seed)
    a = torch.rand(n, ca, generator=gen) * torch.logspace(-2, 2, n)[:, None]
    b = torch.rand(n, cb, generator=gen) * 3
    return a, b


@needs_vnni
@pytest.mark.parametrize("ca,cb", [(48, 16), (4, 60), (20, 0)])
def test_parts_quantize_as_their_concatenation(ca, cb):
    a, b = parts(ca=ca, cb=cb)
    a[::7] = 0
    b[::5] = 0  # some rows all zero, some only zero in one part
    whole = torch.cat([a, b], dim=1)
    q, s = torch.empty(len(a), ca + cb, dtype=torch.uint8), torch.empty(len(a))
    q2, s2 = torch.empty_like(q), torch.empty_like(s)
    assert quantize_rows(whole, q, s) and quantize_rows(RowConcat(a, b), q2, s2)
    assert torch.equal(q, q2) and torch.equal(s, s2)
    if cb:
        b[9, -1] = -1.0  # a negative value in the second part is seen
        assert not quantize_rows(RowConcat(a, b), q2, s2)


@needs_vnni
@pytest.mark.parametrize("precision", ["int8", "fp32"])
def test_a_conv_on_a_row_concat_is_the_conv_on_the_tensor(precision):
    kmap, x, w, bias, _ = case("subm", 64, 48, seed=29)
    a, b = x[:, :48].contiguous(), x[:, 48:].contiguous()
    config = EngineConfig(precision=precision, grouping=INT8)
    with torch.no_grad():
        lazy = RowConcat(a, b)
        got = sparse_conv(lazy, w, kmap, config, bias, relu=True)
        assert torch.equal(got, sparse_conv(x.clone(), w, kmap, config, bias, relu=True))
        assert (lazy._made is None) == (precision == "int8")  # int8 never makes it


def test_anything_else_gets_the_tensor():
    a, b = parts()
    lazy = RowConcat(a, b)
    whole = torch.cat([a, b], dim=1)
    assert lazy.shape == whole.shape and lazy.dim() == 2 and len(lazy) == len(whole)
    assert torch.equal(torch.relu(lazy), whole.relu())
    assert torch.equal(whole + lazy, 2 * whole)
    assert torch.equal(lazy.sum(dim=0), whole.sum(dim=0))  # a tensor attribute
    assert torch.equal(torch.nn.functional.linear(lazy, torch.eye(64)), whole)


def test_only_cpu_int8_inference_defers_the_concatenation():
    a, b = parts()
    with torch.no_grad():
        assert isinstance(concat_rows(a, b, "int8"), RowConcat)
        for other in ("fp32", "bf16"):
            assert torch.equal(concat_rows(a, b, other), torch.cat([a, b], dim=1))
        assert isinstance(concat_rows(a.double(), b.double(), "int8"), torch.Tensor)
        assert isinstance(concat_rows(a[:, ::2], b, "int8"), torch.Tensor)  # not contiguous
    assert isinstance(concat_rows(a, b, "int8"), torch.Tensor)  # autograd on: a real tensor


@needs_vnni
def test_a_minkunet_in_int8_gives_the_same_logits_with_its_stand_ins(monkeypatch):
    """The folded MinkUNet in int8: its decoder concatenations deferred (4, each quantized by
    the upsampling that makes the first part, whose rows stay unkept) and its residual blocks'
    first outputs unkept; every one made and concatenated instead: the same logits."""
    import models.fold as fold
    import models.layers as layers
    from models import SparseTensor
    from models.minkunet import MinkUNet

    from tests.kernels.kernel_helpers import random_cloud

    torch.manual_seed(0)
    net = fold.fold_batchnorm(MinkUNet(4, 19, cr=0.5))
    coords = random_cloud(3000, 20, seed=8, batches=1)
    feats = torch.rand(len(coords), 4)

    def logits():
        x = SparseTensor(feats, coords, engine=EngineConfig(precision="int8"))
        with torch.no_grad():
            return net(x).feats

    outputs = []
    real_conv = layers.sparse_conv
    monkeypatch.setattr(
        layers, "sparse_conv", lambda *a: outputs.append(real_conv(*a)) or outputs[-1]
    )
    deferred = logits()
    concats = [o for o in outputs if isinstance(o, RowConcat)]
    assert len(concats) == 4 and all(isinstance(c.parts[0], UnkeptOutput) for c in concats)
    assert sum(isinstance(o, UnkeptOutput) for o in outputs) > 0
    assert all(o._made is None for o in outputs if isinstance(o, (RowConcat, UnkeptOutput)))
    # every output made, every concatenation by torch.cat (the shortcuts fused in both)
    monkeypatch.setattr(layers, "sparse_conv", lambda *a: real_conv(*a[:7], False, None, *a[9:]))
    monkeypatch.setattr(layers, "concat_rows", lambda a, b, p: torch.cat([a, b], dim=1))
    monkeypatch.setattr(
        fold.FoldedDecoderStage, "forward", lambda m, x, skip: m.blocks(layers.cat(m.up(x), skip))
    )
    assert torch.equal(deferred, logits())


@needs_vnni
@pytest.mark.parametrize("cin", [32, 64])  # AVX512_VNNI; AMX tiles where the CPU has them
@pytest.mark.parametrize("tiles", [True, False])
@pytest.mark.parametrize("finite", [True, False])
def test_an_unkept_output_feeds_the_next_conv_bit_for_bit(cin, tiles, finite):
    """finite False: an infinite bias leaves rows the kernel cannot quantize; the next conv then
    has the output made and quantized (and gives way to its fallback precision) as it would."""
    kmap, x, w, bias, _ = case("subm", cin, 48, seed=31)
    if not finite:
        bias[5] = float("inf")
    w2 = torch.randn(27, 48, 32, generator=torch.Generator().manual_seed(4)) / 20
    config = EngineConfig(precision="int8", grouping=INT8)
    with torch.no_grad(), contextlib.nullcontext() if tiles else amx.tiles_off():
        kept = sparse_conv(x, w, kmap, config, bias, relu=True)
        want = sparse_conv(kept, w2, kmap, config, None, True)
        unkept = sparse_conv(x, w, kmap, config, bias, True, None, only_next_reads=True)
        assert isinstance(unkept, UnkeptOutput) and unkept._made is None
        assert unkept.shape == kept.shape
        assert torch.equal(sparse_conv(unkept, w2, kmap, config, None, True), want)
        assert (unkept._made is None) == finite  # made only where it could not be quantized
        assert torch.equal(unkept.tensor(), kept)


def test_only_int8_inference_leaves_an_output_unkept():
    kmap, x, w, bias, _ = case("subm", 64, 48, seed=33)
    for setting in ("fp32", "bf16"):
        config = EngineConfig(precision=setting, grouping=INT8)
        with torch.no_grad():
            out = sparse_conv(x, w, kmap, config, bias, True, None, only_next_reads=True)
        assert isinstance(out, torch.Tensor)
    config = EngineConfig(precision="int8", grouping=INT8)
    out = sparse_conv(x, w.requires_grad_(), kmap, config, bias, True, None, True)
    assert isinstance(out, torch.Tensor) and out.requires_grad  # training: a tensor


@needs_vnni
@pytest.mark.parametrize("tiles", [True, False])
@pytest.mark.parametrize("relu", [True, False])
def test_an_upsampling_quantizes_itself_beside_the_rows_it_is_concatenated_with(tiles, relu):
    """then_concat: in int8 with a ReLU the conv quantizes [its output | skip] row by row in
    the kernel (the bits ls_quantize_concat_u8_cpu gives), its own rows unkept; the next conv
    gives what it gives on torch.cat of the two; without a ReLU, or in fp32, the result is the
    concatenation as concat_rows makes it."""
    kmap, x, w, bias, _ = case("up", 64, 48, seed=37)
    gen = torch.Generator().manual_seed(6)
    skip = torch.rand(kmap.num_out, 16, generator=gen)
    square = case("subm", 64, 48, seed=37)[0]  # the same cloud: a map on the upsampled rows
    w2 = torch.randn(27, 64, 32, generator=gen) / 20
    config = EngineConfig(precision="int8", grouping=INT8)
    with torch.no_grad(), contextlib.nullcontext() if tiles else amx.tiles_off():
        up = sparse_conv(x, w, kmap, config, bias, relu)
        whole = torch.cat([up, skip], dim=1)
        got = sparse_conv(x, w, kmap, config, bias, relu, None, True, skip)
        assert isinstance(got, RowConcat) and got.shape == whole.shape
        assert isinstance(got.parts[0], UnkeptOutput) == relu
        want = sparse_conv(whole, w2, square, config, None, True)
        assert torch.equal(sparse_conv(got, w2, square, config, None, True), want)
        assert torch.equal(got.tensor(), whole)
    fp32 = EngineConfig(precision="fp32", grouping=INT8)
    with torch.no_grad():
        out = sparse_conv(x, w, kmap, fp32, bias, True, None, True, skip)
    assert torch.equal(out, torch.cat([sparse_conv(x, w, kmap, fp32, bias, True), skip], dim=1))
