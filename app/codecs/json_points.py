"""JSON: {"points": [[x, y, z, intensity, ...], ...]} or the bare list [[x, y, z, ...], ...].

Every row needs the same number (3 or more) of numbers; NaN / Infinity literals are accepted.
Non-numeric values (strings, null, nested lists of numbers where a number belongs...) are a
syntax error for this format (400); a well-formed list of the wrong shape is 422.
"""
from __future__ import annotations

import json

import numpy as np

from app.codecs.base import Frame, check_count, malformed, sensor_for, unusable

FMT = "json"
CONTENT_TYPE = "application/json"


def decode(body: bytes, max_points: int | None = None) -> Frame:
    if isinstance(body, str):
        body = body.encode()
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise malformed(FMT, f"invalid JSON: {e}") from None
    if isinstance(doc, dict):
        if "points" not in doc:
            raise unusable(FMT, "object has no 'points' key")
        doc = doc["points"]
    if not isinstance(doc, list):
        raise unusable(FMT, "points must be a list of [x, y, z, ...] rows, got "
                            f"{type(doc).__name__}")
    check_count(len(doc), max_points, FMT)
    if not doc:
        return Frame(np.zeros((0, 3), np.float32), "kitti", FMT)
    if not all(isinstance(row, list) for row in doc):
        raise unusable(FMT, "every point must be a list [x, y, z, ...]")
    width = len(doc[0])
    if any(len(row) != width for row in doc):
        raise unusable(FMT, "points have different numbers of values")
    if width < 3:
        raise unusable(FMT, f"points have {width} values; need at least x, y, z")
    try:
        arr = np.array(doc)
    except (ValueError, TypeError, OverflowError) as e:  # a nested list in a row
        raise malformed(FMT, f"non-numeric value in points ({e})") from None
    has_bool = (b"true" in body or b"false" in body) and any(
        isinstance(v, bool) for row in doc for v in row)  # np.array would read them as 1 / 0
    if arr.dtype.kind not in "iuf" or arr.ndim != 2 or has_bool:
        bad = next((v for row in doc for v in row
                    if isinstance(v, bool) or not isinstance(v, (int, float))), None)
        raise malformed(FMT, f"non-numeric value in points: {bad!r}")
    points = arr.astype(np.float32)
    return Frame(points, sensor_for(points), FMT)


def encode(points: np.ndarray, wrap: bool = True) -> tuple[bytes, str]:
    """{"points": [...]} (or the bare list with wrap=False); float32 values written so that
    they read back exactly."""
    rows = np.asarray(points, dtype=np.float32).astype(np.float64).tolist()
    body = json.dumps({"points": rows} if wrap else rows, allow_nan=True, separators=(",", ":"))
    return body.encode(), CONTENT_TYPE
