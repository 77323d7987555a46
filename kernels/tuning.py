"""The tuned grouping choice per layer shape and device, as saved by bench/tuner.py (which
measures them).

File format (JSON):
    {"version": 1,
     "defaults": {"cpu": {"epsilon": 0.0, "S": 0, "dataflow": "fused"},
                  "cuda": {"epsilon": 0.3, "S": 65536}},
     "entries": {"cpu/k27/64x64": {"epsilon": 0.0, "S": 0, "ms": {...measurements...}}, ...}}
S may be the string "inf". "dataflow" is "grouped" (gather, grouped mm/bmm, scatter: the default)
or "fused" (CPU only: fetch-on-demand gather-GEMM-scatter in one kernel, offsets in the order the
grouping gives); int8 entries (below) say "int8" where the int8 kernel runs the shape, else the
setting of their fallback precision, which then runs it (kernels/precision.py, fallback).
A shape missing from `entries` takes the entry of the same device and kernel volume with the
nearest Cin * Cout, then the device default.

Precision (kernels/precision.py) is part of the device: fp32 entries and defaults are keyed by
the device type alone ("cpu/k27/64x64", "cpu"), the others by device type and precision
("cpu/bf16/k27/64x64", "cpu/bf16"); a precision with no default of its own takes the built-in
one (cpu/int8: the int8 kernel), else the device's. An entry without a dataflow takes the one of
its precision's default, else its device's (a cpu/int8 entry: "int8"; cpu/bf16: "fused").
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, TypeAlias

# (epsilon, S, dataflow); a setting given without its dataflow is "grouped"
Setting: TypeAlias = tuple[float, float] | tuple[float, float, str]

DEFAULT_PATH = Path(__file__).resolve().parent / "tuned" / "grouping.json"
BUILTIN_DEFAULTS: dict[str, tuple[float, float, str]] = {
    "cpu": (0.0, 0.0, "fused"),
    "cuda": (0.3, 65536.0, "grouped"),
    "cpu/int8": (0.0, 0.0, "int8"),
}
DATAFLOWS = ("grouped", "fused", "int8")


def device_key(device_type: str, precision: str = "fp32") -> str:
    return device_type if precision == "fp32" else f"{device_type}/{precision}"


def shape_key(
    device_type: str, kernel_volume: int, cin: int, cout: int, precision: str = "fp32"
) -> str:
    return f"{device_key(device_type, precision)}/k{kernel_volume}/{cin}x{cout}"


def _threshold(value) -> float:
    return math.inf if value in ("inf", None) else float(value)


def _setting(v: dict, fallback: str = "grouped") -> tuple[float, float, str]:
    dataflow = v.get("dataflow", fallback)
    if dataflow not in DATAFLOWS:
        raise ValueError(f"unknown dataflow {dataflow!r} (one of {', '.join(DATAFLOWS)})")
    return float(v["epsilon"]), _threshold(v["S"]), dataflow


@dataclass(frozen=True)
class GroupingTable:
    entries: Mapping[str, Setting] = field(default_factory=dict)
    defaults: Mapping[str, Setting] = field(
        default_factory=lambda: MappingProxyType(dict(BUILTIN_DEFAULTS))
    )

    # choose()'s answers by its arguments: a frame asks for the same few shapes 50 times, and
    # each answer took a key string and a table look-up (or a scan of the entries)
    _chosen: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def choose(
        self, device_type: str, kernel_volume: int, cin: int, cout: int, precision: str = "fp32"
    ) -> tuple[float, float, str]:
        """(epsilon, S, dataflow) for one layer shape on one device type in one precision."""
        args = (device_type, kernel_volume, cin, cout, precision)
        chosen = self._chosen.get(args)
        if chosen is None:
            chosen = self._chosen[args] = self._look_up(*args)
        return chosen

    def _look_up(
        self, device_type: str, kernel_volume: int, cin: int, cout: int, precision: str
    ) -> tuple[float, float, str]:
        found = self.entries.get(shape_key(device_type, kernel_volume, cin, cout, precision))
        if found is None:
            prefix = f"{device_key(device_type, precision)}/k{kernel_volume}/"
            near = [
                (abs(math.log(int(a) * int(b) / (cin * cout))), v)
                for key, v in self.entries.items()
                if key.startswith(prefix)
                for a, b in [key[len(prefix) :].split("x")]
            ]
            found = (
                min(near, key=lambda t: t[0])[1]
                if near
                else self.defaults.get(
                    device_key(device_type, precision),
                    BUILTIN_DEFAULTS.get(device_key(device_type, precision))
                    or self.defaults.get(device_type, BUILTIN_DEFAULTS["cpu"]),
                )
            )
        return (*found, "grouped") if len(found) == 2 else found

    @classmethod
    def from_json(cls, data: dict) -> "GroupingTable":
        if data.get("version") != 1:
            raise ValueError(f"unsupported grouping file version {data.get('version')!r}")
        defaults = dict(BUILTIN_DEFAULTS)
        defaults.update(
            {
                k: _setting(v, BUILTIN_DEFAULTS.get(k, ("", "", "grouped"))[2])
                for k, v in data.get("defaults", {}).items()
            }
        )

        def dataflow_default(key: str) -> str:  # the entry's precision's, else its device's
            precision_key, device = key.rsplit("/", 2)[0], key.split("/")[0]
            return defaults.get(precision_key, defaults.get(device, ("", "", "grouped")))[2]

        entries = {k: _setting(v, dataflow_default(k)) for k, v in data["entries"].items()}
        return cls(MappingProxyType(entries), MappingProxyType(defaults))

    @classmethod
    def load(cls, path: str | Path) -> "GroupingTable":
        return cls.from_json(json.loads(Path(path).read_text()))

    @staticmethod
    @functools.lru_cache(maxsize=1)
    def load_default() -> "GroupingTable":
        """The shipped tuning file (loaded once per process), or built-in defaults."""
        if DEFAULT_PATH.exists():
            return GroupingTable.load(DEFAULT_PATH)
        return GroupingTable()
