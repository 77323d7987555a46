"""The network's head in its last int8 conv (sparse_conv `head`, csrc/fused_int8_cpu.cpp
HeadBlock): each row's class as linear_argmax_u8 gives it on the rows the conv writes out, the
same classes, with and without a residual or a shortcut, on AMX tiles and on AVX512_VNNI; the
rows themselves (ClassifiedOutput) made on use, the same bits. Elsewhere (no ReLU, other
precisions, a strided conv, another width) the conv gives its rows as ever. And in the
pipeline: the folded MinkUNet's last block computes the classes, which are the logits' argmax."""

import contextlib

import numpy as np
import pytest
import torch

from kernels import amx
from kernels.concat import ClassifiedOutput
from kernels.engine import EngineConfig, sparse_conv
from kernels.rows import head_columns, linear_argmax_u8

from tests.kernels.kernel_helpers import INT8, a_head, block_case, case, needs_vnni


@needs_vnni
@pytest.mark.parametrize("tiles", [True, False])
@pytest.mark.parametrize("extra", ["none", "residual", "shortcut"])
def test_the_last_conv_classifies_its_rows_as_the_head_would(tiles, extra):
    kmap, (x0, w0, b0), w, bias, shortcut = block_case(32)
    weight, head_bias = a_head(64)
    config = EngineConfig(precision="int8", grouping=INT8)
    with torch.no_grad(), contextlib.nullcontext() if tiles else amx.tiles_off():
        x = sparse_conv(x0, w0, kmap, config, b0, True)  # its quantization on record
        res = sparse_conv(*shortcut[:2], shortcut[3], config, shortcut[2])
        residual = res if extra == "residual" else None
        fused = shortcut if extra == "shortcut" else None
        head = head_columns(weight, head_bias)
        rows = sparse_conv(x, w, kmap, config, bias, True, residual, False, None, fused)
        got = sparse_conv(x, w, kmap, config, bias, True, residual, False, None, fused, head)
        assert isinstance(got, ClassifiedOutput) and got._made is None
        assert torch.equal(got.classes, linear_argmax_u8(rows, weight, head_bias))
        assert torch.equal(got.tensor(), rows)  # made on use: the conv again, the same bits
        logits = rows @ weight.t() + head_bias
        assert (got.classes.long() == logits.argmax(1)).float().mean() > 0.99


@needs_vnni
def test_the_conv_keeps_its_rows_where_it_cannot_classify_them():
    kmap, x, w, bias, _ = case("subm", 64, 48, seed=33)
    config = EngineConfig(precision="int8", grouping=INT8)
    with torch.no_grad():
        want = sparse_conv(x, w, kmap, config, bias, True)
        for head in (head_columns(*a_head(32)), None):  # another width; no head at all
            got = sparse_conv(x, w, kmap, config, bias, True, None, False, None, None, head)
            assert type(got) is torch.Tensor and torch.equal(got, want)
        plain = sparse_conv(x, w, kmap, config, bias, False)  # no ReLU: rows may be negative
        head = head_columns(*a_head(48))
        got = sparse_conv(x, w, kmap, config, bias, False, None, False, None, None, head)
        assert type(got) is torch.Tensor and torch.equal(got, plain)
        for setting in ("fp32", "bf16"):
            other = EngineConfig(precision=setting, grouping=INT8)
            got = sparse_conv(x, w, kmap, other, bias, True, None, False, None, None, head)
            assert type(got) is torch.Tensor
    assert head_columns(*a_head(48, classes=33)) is None  # wider than the kernel's 32 lanes


@needs_vnni
def test_the_pipeline_takes_its_classes_from_the_last_conv(monkeypatch):
    """int8: the folded MinkUNet's last block hands the head to its last conv (feeds_head), the
    one-pass head never runs, and the labels are those of the kept logits."""
    import app.inference.pipeline as pipeline_module
    from app.inference.builder import build_pipeline

    from tests.app.frame_helpers import kitti_frame

    pipeline = build_pipeline("synthetic", precision="int8")
    marked = [m for m in pipeline.network.modules() if getattr(m, "feeds_head", False)]
    assert len(marked) == 1 and pipeline._head_blocks == tuple(marked)
    calls = []
    real = pipeline_module.linear_argmax_u8
    monkeypatch.setattr(pipeline_module, "linear_argmax_u8", lambda *a: calls.append(1) or real(*a))
    points = kitti_frame()[:40000]
    fast = pipeline.segment(points)
    assert calls == [] and marked[0].head is None  # the head is handed only within the stage
    slow = pipeline.segment(points, keep_logits=True)
    assert np.mean(fast.labels == slow.labels) > 0.999
