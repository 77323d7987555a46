"""The tuned grouping choice per layer shape and device, as saved by kernels/tuner.py.

File format (JSON):
    {"version": 1,
     "defaults": {"cpu": {"epsilon": 0.0, "S": 0}, "cuda": {"epsilon": 0.3, "S": 65536}},
     "entries": {"cpu/k27/64x64": {"epsilon": 0.0, "S": 0, "ms": {...measurements...}}, ...}}
S may be the string "inf". A shape missing from `entries` takes the entry of the same device and
kernel volume with the nearest Cin * Cout, then the device default.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

DEFAULT_PATH = Path(__file__).resolve().parent / "tuned" / "grouping.json"
BUILTIN_DEFAULTS = {"cpu": (0.0, 0.0), "cuda": (0.3, 65536.0)}


def shape_key(device_type: str, kernel_volume: int, cin: int, cout: int) -> str:
    return f"{device_type}/k{kernel_volume}/{cin}x{cout}"


def _threshold(value) -> float:
    return math.inf if value in ("inf", None) else float(value)


@dataclass(frozen=True)
class GroupingTable:
    entries: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    defaults: Mapping[str, tuple[float, float]] = field(
        default_factory=lambda: MappingProxyType(dict(BUILTIN_DEFAULTS)))

    def choose(self, device_type: str, kernel_volume: int, cin: int, cout: int):
        """(epsilon, S) for one layer shape on one device type."""
        exact = self.entries.get(shape_key(device_type, kernel_volume, cin, cout))
        if exact is not None:
            return exact
        prefix = f"{device_type}/k{kernel_volume}/"
        near = [(abs(math.log(int(a) * int(b) / (cin * cout))), v)
                for key, v in self.entries.items() if key.startswith(prefix)
                for a, b in [key[len(prefix):].split("x")]]
        if near:
            return min(near, key=lambda t: t[0])[1]
        return self.defaults.get(device_type, BUILTIN_DEFAULTS["cpu"])

    @classmethod
    def from_json(cls, data: dict) -> "GroupingTable":
        if data.get("version") != 1:
            raise ValueError(f"unsupported grouping file version {data.get('version')!r}")
        entries = {k: (float(v["epsilon"]), _threshold(v["S"])) for k, v in data["entries"].items()}
        defaults = dict(BUILTIN_DEFAULTS)
        defaults.update({k: (float(v["epsilon"]), _threshold(v["S"]))
                         for k, v in data.get("defaults", {}).items()})
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
