"""kernels/precision.py's auto choice on CPUs other than this one (the features stood in)."""

from __future__ import annotations

import pytest

from kernels import precision


@pytest.mark.parametrize(
    "int8_lanes,bf16,chosen",
    [(16, True, "int8"), (8, False, "int8"), (0, True, "bf16"), (0, False, "fp32")],
)
def test_auto_takes_int8_then_native_bf16_then_fp32(monkeypatch, int8_lanes, bf16, chosen):
    monkeypatch.setattr(precision, "fused_int8_lanes", lambda: int8_lanes)
    monkeypatch.setattr(precision, "native_bf16", lambda: bf16)
    assert precision.resolve("auto") == chosen
    assert precision.resolve(None) == chosen
    assert precision.resolve("auto", "cuda") == "fp32"  # a CPU-only setting
    assert precision.fallback("int8") == ("bf16" if bf16 else "fp32")
