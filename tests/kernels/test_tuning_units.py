"""kernels/tuning.py's look-up against hand-made tables: the nearest shape by |log| of the
Cin * Cout ratio, a precision's built-in default
before the device's, a setting without its dataflow, and the file's checks (version, dataflow)."""

from __future__ import annotations

import math

import pytest

from kernels.tuning import GroupingTable


def table(entries: dict, defaults: dict | None = None, version=1) -> GroupingTable:
    return GroupingTable.from_json(
        {"version": version, "defaults": defaults or {}, "entries": entries}
    )


def setting(eps: float, dataflow: str = "grouped") -> dict:
    return {"epsilon": eps, "S": 0, "dataflow": dataflow}


def test_a_missing_shape_takes_the_nearest_cin_cout_in_ratio():
    t = table({"cpu/k27/16x16": setting(0.1), "cpu/k27/64x64": setting(0.2)})
    assert t.choose("cpu", 27, 32, 64)[0] == 0.2  # 2048: 4096 is 2x off, 256 8x
    assert t.choose("cpu", 27, 16, 32)[0] == 0.1  # 512: 256 is 2x off, 4096 8x
    assert t.choose("cpu", 27, 4, 4)[0] == 0.1  # below both: the smaller
    assert t.choose("cpu", 27, 128, 128)[0] == 0.2  # above both: the larger


def test_a_precision_without_a_default_takes_its_built_in_one_first():
    t = GroupingTable(defaults={"cpu": (0.5, 0.0, "fused")})
    assert t.choose("cpu", 27, 8, 8, "int8") == (0.0, 0.0, "int8")  # BUILTIN cpu/int8
    assert t.choose("cpu", 27, 8, 8, "bf16") == (0.5, 0.0, "fused")  # none built in: the cpu's


def test_a_setting_without_its_dataflow_is_grouped():
    t = GroupingTable(defaults={"cpu": (0.25, 8.0)})
    assert t.choose("cpu", 27, 8, 8) == (0.25, 8.0, "grouped")


def test_an_entry_without_its_dataflow_takes_its_device_defaults():
    t = table(
        {"cpu/k27/4x4": {"epsilon": 0.1, "S": "inf"}, "cuda/k27/4x4": {"epsilon": 0.2, "S": 9}},
        {"cpu": {"epsilon": 0.0, "S": 0}},  # a cpu default without one: the built-in fused
    )
    assert t.choose("cpu", 27, 4, 4) == (0.1, math.inf, "fused")
    assert t.choose("cuda", 27, 4, 4) == (0.2, 9.0, "grouped")
    assert t.choose("cpu", 8, 4, 4) == (0.0, 0.0, "fused")


def test_an_entry_without_its_dataflow_takes_its_precisions_default_first():
    """An int8 entry without a dataflow runs the int8 kernel (cpu/int8's default), not the
    device's fp32 one; a precision with no default of its own (bf16) takes the device's."""
    t = table(
        {
            "cpu/int8/k27/4x4": {"epsilon": 0.1, "S": 0},
            "cpu/bf16/k27/4x4": {"epsilon": 0.2, "S": 0},
        }
    )
    assert t.choose("cpu", 27, 4, 4, "int8") == (0.1, 0.0, "int8")
    assert t.choose("cpu", 27, 4, 4, "bf16") == (0.2, 0.0, "fused")


def test_s_may_be_inf_or_null():
    t = table({"cpu/k27/4x4": {"epsilon": 0.1, "S": None, "dataflow": "grouped"}})
    assert t.choose("cpu", 27, 4, 4) == (0.1, math.inf, "grouped")


def test_an_unknown_dataflow_is_refused():
    with pytest.raises(ValueError, match="unknown dataflow 'dense'"):
        table({"cpu/k27/4x4": setting(0.1, "dense")})
    with pytest.raises(ValueError, match="unknown dataflow"):
        table({}, {"cuda": setting(0.1, "gemm")})


@pytest.mark.parametrize("version", [0, 2, None, "1"])
def test_only_version_1_is_read(version):
    with pytest.raises(ValueError, match="unsupported grouping file version"):
        table({}, version=version)
