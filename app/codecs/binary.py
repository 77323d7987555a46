"""Raw little-endian float32 records: kitti (x y z intensity 0..1), ouster (x y z intensity
0..255), nuscenes (x y z intensity 0..255 ring), xyz."""

from __future__ import annotations

import numpy as np

from app.codecs.base import DecodeError, Frame, check_count

# format -> (float32 fields per point, sensor: the intensity convention)
LAYOUTS = {
    "kitti": (4, "kitti"),
    "ouster": (4, "ouster"),
    "nuscenes": (5, "nuscenes"),
    "xyz": (3, "kitti"),
}
CONTENT_TYPES = {
    "kitti": "application/x-kitti",
    "ouster": "application/x-ouster",
    "nuscenes": "application/x-nuscenes",
    "xyz": "application/x-xyz",
}


def decode(body: bytes, fmt: str, max_points: int | None = None) -> Frame:
    fields, sensor = LAYOUTS[fmt]
    size = 4 * fields
    if len(body) % size:
        raise DecodeError(
            400,
            "malformed_body",
            f"{fmt}: body of {len(body)} bytes is not a multiple of the point size "
            f"({fields} float32 = {size} bytes)",
        )
    check_count(len(body) // size, max_points, fmt)
    return Frame(np.frombuffer(body, dtype="<f4").reshape(-1, fields), sensor, fmt)


def encode(points: np.ndarray, fmt: str) -> tuple[bytes, str]:
    """The first F columns as little-endian float32 (missing columns written as 0)."""
    fields, _ = LAYOUTS[fmt]
    out = np.zeros((len(points), fields), dtype="<f4")
    k = min(fields, points.shape[1])
    out[:, :k] = points[:, :k]
    return out.tobytes(), CONTENT_TYPES[fmt]
