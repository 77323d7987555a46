"""kernels/concat.py, kernels/derived.py and kernels/rows.py at what the
oracle tests never reach: a concatenation of parts with other row counts or a non-contiguous
part, an unkept output asked for `classes`, a weight whose storage is swapped, a head whose
features are not the rows', a head not in fp32."""

from __future__ import annotations

import pytest
import torch

from kernels.concat import RowConcat, UnkeptOutput, concat_rows
from kernels.derived import derived
from kernels.rows import linear_argmax_u8


def test_parts_of_other_row_counts_are_not_concatenated_lazily():
    with torch.no_grad(), pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        concat_rows(torch.rand(5, 3), torch.rand(6, 2), "int8")


def test_a_non_contiguous_part_gets_the_tensor():
    a, b = torch.rand(6, 3), torch.rand(2, 6).t()
    with torch.no_grad():
        out = concat_rows(a, b, "int8")
        assert not isinstance(out, RowConcat) and torch.equal(out, torch.cat([a, b], 1))
        assert isinstance(concat_rows(a, b.contiguous(), "int8"), RowConcat)


def test_an_unkept_output_has_no_classes_and_is_not_made_for_asking():
    made = []
    out = UnkeptOutput((4, 2), lambda: made.append(1) or torch.zeros(4, 2))
    assert not hasattr(out, "classes") and out._made is None and not made


def test_a_derived_value_follows_the_weights_storage():
    w = torch.ones(3)
    assert derived(w, "test-sum", lambda t: float(t.sum())) == 3.0
    w.data = torch.full((3,), 2.0)  # new storage, no in-place write
    assert derived(w, "test-sum", lambda t: float(t.sum())) == 6.0


def test_a_head_needs_the_rows_features_and_fp32():
    x, w, b = torch.rand(10, 8), torch.randn(4, 8), torch.randn(4)
    with torch.no_grad():
        assert linear_argmax_u8(x, w, b) is not None
        assert linear_argmax_u8(x[:, :7].contiguous(), w, b) is None  # 7 features, head takes 8
        assert linear_argmax_u8(x, w.double(), b.double()) is None
