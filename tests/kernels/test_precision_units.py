"""kernels/precision.py's checks on CPUs other than this one (features and kernels stood in):
a requested name with spaces and capitals, int8 and bf16 refused where the CPU lacks what they
need (at start-up by the flags, at run time by the kernels)."""

from __future__ import annotations

import pytest

from kernels import precision
from kernels.precision import PrecisionError


@pytest.fixture
def cpu(monkeypatch):
    """Stands in a CPU: its /proc/cpuinfo features, int8 kernel lanes and native bf16."""

    def make(features=(), int8_lanes=0, bf16=False):
        monkeypatch.setattr(precision, "cpu_features", lambda: tuple(features))
        monkeypatch.setattr(precision, "fused_int8_lanes", lambda: int8_lanes)
        monkeypatch.setattr(precision, "native_bf16", lambda: bf16)

    return make


@pytest.mark.parametrize("name", [" INT8 ", "Int8", "int8\n"])
def test_a_name_is_read_without_case_or_spaces(name):
    assert precision.validate(name) == "int8"


def test_int8_is_refused_without_an_int8_kernel(cpu):
    cpu(features=("AVX512F",), int8_lanes=0, bf16=True)
    for check in (precision.offered, precision.resolve):
        with pytest.raises(PrecisionError, match="int8 needs AVX2"):
            check("int8")
    cpu(features=("AVX2",), int8_lanes=8)
    assert precision.offered("int8") == precision.resolve("int8") == "int8"


def test_bf16_is_refused_without_native_bf16(cpu):
    cpu(features=("AVX2", "AVX512F"), int8_lanes=8, bf16=False)
    for check in (precision.offered, precision.resolve):
        with pytest.raises(PrecisionError, match="bf16 needs AVX512_BF16 or AMX_BF16"):
            check("bf16")
