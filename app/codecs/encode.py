"""Frames -> wire bytes in every format decode() reads (for tests and the client CLI).

encode(points, fmt, **options) -> (body, content_type). points: [N, F] with x, y, z first, then
intensity (column 3) and, for nuscenes, ring (column 4). Format variants are chosen by name
(VARIANTS) or by options passed on to the format's encoder:
  pcd          data="binary" | "ascii" | "binary_compressed", width/height (organised),
               dtypes={"x": "f8", "intensity": "u1"}, intensity_name, lzf_matches
  ply          encoding="binary_little_endian" | "binary_big_endian" | "ascii", dtypes,
               intensity_name
  npy          dtype="<f4" | "<f8" | ...
  las          scale (coordinate resolution, default 1e-5 m)
  pointcloud2  big_endian (CDR), data_big_endian, height, row_padding, point_padding, dtypes,
               intensity_name, frame_id
  json         wrap=True ({"points": [...]}) or False (bare list)
  kitti / nuscenes / xyz: the first 4 / 5 / 3 columns as float32 (missing ones written as 0)
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from app.codecs import binary, json_points, las, npy, pcd, ply, pointcloud2

_ENCODERS: dict[str, Callable[..., tuple[bytes, str]]] = {
    "pcd": pcd.encode,
    "ply": ply.encode,
    "npy": npy.encode,
    "las": las.encode,
    "pointcloud2": pointcloud2.encode,
    "json": json_points.encode,
}

# variant name -> (format, options)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "pcd_ascii": ("pcd", {"data": "ascii"}),
    "pcd_binary": ("pcd", {"data": "binary"}),
    "pcd_binary_compressed": ("pcd", {"data": "binary_compressed"}),
    "ply_ascii": ("ply", {"encoding": "ascii"}),
    "ply_binary_little_endian": ("ply", {"encoding": "binary_little_endian"}),
    "ply_binary_big_endian": ("ply", {"encoding": "binary_big_endian"}),
    "npy_float64": ("npy", {"dtype": "<f8"}),
    "pointcloud2_big_endian": ("pointcloud2", {"big_endian": True}),
}


def encode(points: np.ndarray, fmt: str, **options) -> tuple[bytes, str]:
    """(body, content type) of the points in `fmt` (a format name or a VARIANTS name)."""
    points = np.asarray(points)
    if points.ndim != 2 or points.shape[1] < 3:
        raise ValueError(f"points must be [N, 3+], got {points.shape}")
    if fmt in VARIANTS:
        fmt, preset = VARIANTS[fmt]
        options = {**preset, **options}
    if fmt in binary.LAYOUTS:
        if options:
            raise TypeError(f"{fmt} takes no options, got {sorted(options)}")
        return binary.encode(points, fmt)
    if fmt not in _ENCODERS:
        raise ValueError(
            f"unknown format {fmt!r}; known: {', '.join([*binary.LAYOUTS, *_ENCODERS, *VARIANTS])}"
        )
    return _ENCODERS[fmt](points, **options)
