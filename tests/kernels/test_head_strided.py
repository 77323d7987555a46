"""An int8 conv handed the network's head classifies its rows only where they come in the
input's order (a submanifold conv: kernels/int8.py _head_here); a strided conv or an upsampling
gives its rows as ever (test_head.py covers the other cases its doc names)."""

from __future__ import annotations

import pytest
import torch

from kernels.engine import EngineConfig, sparse_conv
from kernels.rows import head_columns
from tests.kernels.kernel_helpers import INT8, a_head, case, needs_vnni


@needs_vnni
@pytest.mark.parametrize("kind", ["down", "up"])
def test_a_strided_conv_keeps_its_rows_with_a_head(kind):
    kmap, x, w, bias, _ = case(kind, 64, 48, seed=33)
    config = EngineConfig(precision="int8", grouping=INT8)
    with torch.no_grad():  # head_columns takes no head where a gradient is wanted
        head = head_columns(*a_head(48))
        assert head is not None
        want = sparse_conv(x, w, kmap, config, bias, True)
        got = sparse_conv(x, w, kmap, config, bias, True, None, False, None, None, head)
    assert type(got) is torch.Tensor and torch.equal(got, want)
