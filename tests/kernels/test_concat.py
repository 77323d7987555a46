"""The stand-ins never made (kernels/concat.py). The decoder's concatenation: quantizing its two
parts side by side is quantizing the concatenation, bit for bit; convs on a RowConcat give what
they give on the tensor, in int8 and in the precisions that make the tensor; anything else that
touches it gets the tensor. A residual block's first conv kept only quantized (UnkeptOutput):
the next conv gives the bits it gives on the fp32 output, which is made, the same bits, when
something asks for it."""

import contextlib

import pytest
import torch

from kernels import precision
from kernels.concat import RowConcat, UnkeptOutput, concat_rows
from kernels.engine import EngineConfig, sparse_conv
from kernels.int8 import quantize_rows

from tests.kernels.test_int8 import INT8, case, needs_vnni


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
def test_a_minkunet_in_int8_gives_the_same_logits_with_the_concatenations_deferred(monkeypatch):
    import models.layers as layers
    from models import SparseTensor
    from models.fold import fold_batchnorm
    from models.minkunet import MinkUNet

    from tests.kernels.test_engine import random_cloud

    torch.manual_seed(0)
    net = fold_batchnorm(MinkUNet(4, 19, cr=0.5))
    coords = random_cloud(3000, 20, seed=8, batches=1)
    feats = torch.rand(len(coords), 4)

    def logits():
        x = SparseTensor(feats, coords, engine=EngineConfig(precision="int8"))
        with torch.no_grad():
            return net(x).feats

    made = []
    real = layers.concat_rows
    monkeypatch.setattr(layers, "concat_rows", lambda *a: made.append(real(*a)) or made[-1])
    deferred = logits()
    assert len(made) == 4 and all(isinstance(m, RowConcat) and m._made is None for m in made)
    monkeypatch.setattr(layers, "concat_rows", lambda a, b, p: torch.cat([a, b], dim=1))
    assert torch.equal(deferred, logits())
    # and with every residual block's first output kept in fp32: the same logits again
    unkept = []
    real_conv = layers.sparse_conv

    def conv(*args, **kwargs):
        out = real_conv(*args, **kwargs)
        unkept.append(isinstance(out, UnkeptOutput))
        return out

    monkeypatch.setattr(layers, "sparse_conv", conv)
    assert torch.equal(deferred, logits()) and any(unkept)
    monkeypatch.setattr(layers, "sparse_conv", lambda *a: real_conv(*a[:7]))  # all kept
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
    with torch.no_grad(), contextlib.nullcontext() if tiles else precision.tiles_off():
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
