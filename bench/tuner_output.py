"""The file bench/tuner.py writes, kernels/tuned/grouping.json unless --out (format:
kernels/tuning.py, version 1): the file as it stands, the device default it gives, and the merge of
one run into it (this device's measured shapes replaced, every other entry kept).
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.tuner_candidates import Setting, as_setting, entry_of
from kernels.tuning import BUILTIN_DEFAULTS, GroupingTable


def load_existing(path: Path) -> dict:
    if path.exists():
        data = json.loads(path.read_text())
        GroupingTable.from_json(data)  # validates the format before we merge into it
        return data
    return {"version": 1, "defaults": {}, "entries": {}}


def file_default(table: GroupingTable, device_type: str, dev_key: str) -> Setting:
    """The file's default for this device and precision (dev_key) as the engine reads it (a
    missing "dataflow" -> the built-in one's)."""
    defaults = table.defaults
    builtin = BUILTIN_DEFAULTS.get(device_type, (0.0, 0.0))
    return as_setting(defaults.get(dev_key, defaults.get(device_type, builtin)))


def is_key_of(key: str, device_type: str, precision: str) -> bool:
    """Whether a file entry ("cpu/k27/64x64", "cpu/bf16/k27/64x64") is this device's and
    precision's."""
    parts = key.split("/")
    if precision == "fp32":
        return parts[0] == device_type and parts[1].startswith("k")
    return parts[:2] == [device_type, precision]


def write_merged(
    path: Path, existing: dict, dev_key: str, default: Setting, entries: dict, tuned_with: dict
) -> None:
    """Merges one run (its device default, entries and how it was tuned, under dev_key) into the
    file's contents `existing` and writes them to path, once they parse as the engine reads them."""
    data = existing
    data["version"] = 1
    data.setdefault("defaults", {})
    for dev, setting in BUILTIN_DEFAULTS.items():
        data["defaults"].setdefault(dev, entry_of(as_setting(setting)))
    data["defaults"][dev_key] = entry_of(default)
    data.setdefault("entries", {}).update(entries)
    data["entries"] = dict(sorted(data["entries"].items()))
    data.setdefault("tuned_with", {})[dev_key] = tuned_with
    GroupingTable.from_json(data)  # what the engine will load must parse
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
