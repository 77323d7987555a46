"""A residual block's 1x1 shortcut run inside its second conv's int8 kernel (sparse_conv
`shortcut`, csrc/fused_int8_cpu.cpp): the same output as the shortcut computed first and added
as the residual (to fp32 rounding: the biases add in another order), on AMX tiles and on
the vector int8 kernels; computed first wherever an input's quantization is not on record, in other
precisions, and for a timed layer."""

import contextlib

import pytest
import torch

import kernels.int8 as int8_module
from kernels import amx
from kernels.engine import EngineConfig, sparse_conv

from tests.kernels.kernel_helpers import INT8, block_case, needs_vnni


@needs_vnni
@pytest.mark.parametrize("tiles", [True, False])
@pytest.mark.parametrize("cin_sc", [32, 64])
def test_the_shortcut_in_the_kernel_is_the_shortcut_added(monkeypatch, tiles, cin_sc):
    kmap, (x0, w0, b0), w, bias, shortcut = block_case(cin_sc)
    fused = []
    real = int8_module._shortcut_args
    monkeypatch.setattr(int8_module, "_shortcut_args", lambda s: fused.append(s) or real(s))
    config = EngineConfig(precision="int8", grouping=INT8)
    with torch.no_grad(), contextlib.nullcontext() if tiles else amx.tiles_off():
        x = sparse_conv(x0, w0, kmap, config, b0, True)  # its quantization on record
        res = sparse_conv(*shortcut[:2], shortcut[3], config, shortcut[2])  # records xs too
        want = sparse_conv(x, w, kmap, config, bias, True, res)
        fused.clear()
        got = sparse_conv(x, w, kmap, config, bias, True, None, False, None, shortcut)
        assert fused[-1] is not None  # the kernel ran the shortcut
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
        # xs no longer on record (another input quantized since): the shortcut runs first
        sparse_conv(x0.clone(), w0, kmap, config, b0)
        fused.clear()
        again = sparse_conv(x, w, kmap, config, bias, True, None, False, None, shortcut)
        assert all(s is None for s in fused)
        assert torch.equal(again, sparse_conv(x, w, kmap, config, bias, True, res))


@pytest.mark.parametrize("setting", ["fp32", "bf16"])
def test_other_precisions_add_the_shortcut_computed_first(setting):
    kmap, _, w, bias, shortcut = block_case(32)
    x = torch.rand(kmap.num_in, 48)
    config = EngineConfig(precision=setting)
    with torch.no_grad():
        res = sparse_conv(*shortcut[:2], shortcut[3], config, shortcut[2])
        want = sparse_conv(x, w, kmap, config, bias, True, res)
        got = sparse_conv(x, w, kmap, config, bias, True, None, False, None, shortcut)
    assert torch.equal(got, want)


def test_a_timed_shortcut_runs_as_its_own_layer():
    """layer_clock's hooks on the shortcut conv: the folded block calls it as a module."""
    from models.fold import _bare_shortcut, fold_batchnorm
    from models.minkunet import MinkUNet

    net = fold_batchnorm(MinkUNet(4, 19, cr=0.5))
    block = net.decoder[0].blocks[0]
    conv = _bare_shortcut(block.shortcut)
    assert conv is not None
    handle = conv.register_forward_hook(lambda *a: None)
    try:
        assert _bare_shortcut(block.shortcut) is None
    finally:
        handle.remove()
