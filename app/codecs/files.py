"""Reading frames from files for the command line: .npy, and .bin files in the wire's raw float32
layouts (app/codecs/binary.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.codecs.binary import LAYOUTS as BIN_FORMATS  # the wire's raw float32 layouts


def infer_format(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".npy"):
        return "npy"
    if name.endswith(".pcd.bin") or "lidar_top" in name:
        return "nuscenes"
    if "os1" in name or "ouster" in name:
        return "ouster"
    return "kitti"


def posting_format(path: Path, fmt: str | None = None) -> str | None:
    """The format to post a file as: `fmt` if given; a .bin file's raw layout by its name
    (nuScenes' .pcd.bin, an Ouster's scans, else kitti); else None, for the service to infer
    from the bytes."""
    if fmt is None and path.name.lower().endswith(".bin"):
        return infer_format(path)
    return fmt


def read_frame(path: str | Path, fmt: str | None = None) -> tuple[np.ndarray, str]:
    """(points float32 [N, F], sensor name) from a .bin (KITTI / nuScenes / Ouster xyzr / xyz)
    or .npy file."""
    path = Path(path)
    fmt = fmt or infer_format(path)
    if fmt == "npy":
        points = np.load(path).astype(np.float32)
        if points.ndim != 2 or points.shape[1] < 3:
            raise ValueError(f"{path}: expected an [N, 3+] array, got {points.shape}")
        return points, "kitti"
    if fmt not in BIN_FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {sorted(BIN_FORMATS) + ['npy']}")
    fields, sensor = BIN_FORMATS[fmt]
    raw = np.fromfile(path, dtype=np.float32)
    if raw.size % fields:
        raise ValueError(
            f"{path}: {raw.size * 4} bytes is not a whole number of {fmt} points "
            f"({fields} float32 each)"
        )
    return raw.reshape(-1, fields), sensor
