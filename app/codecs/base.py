"""Shared types and helpers of the wire codecs (imported by every format module)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

# The intensity conventions a frame is read in (Frame.sensor): kitti 0..1, nuscenes and ouster
# 0..255 (a model's checkpoint scales each to its feature).
SENSORS = ("kitti", "nuscenes", "ouster")
# A self-describing frame is on the 0..255 scale when at least this share of its finite
# intensities exceeds 1.0: one stray value above 1 (a corrupt point in a 0..1 frame) no longer
# rescales the other points (it is clamped, and counted as cleaned).
BYTE_SCALE_SHARE = 0.01
# Names a point cloud may use for its reflectance channel, in order of preference: an Ouster
# ROS cloud has both `intensity` (signal photons, in the thousands) and `reflectivity` (the
# calibrated 0..255 the model's Ouster convention is; shared/data/real/SOURCES.md), and until
# 2026-12-06 the signal was read, clamped at 255.
INTENSITY_NAMES = ("reflectivity", "intensity", "i")
# Text values are parsed this many bytes at a time: bounded scratch memory, and no single C call
# holds the GIL for long (the event loop keeps answering probes during a large decode).
TEXT_CHUNK = 16 * 1024
_SPACE = re.compile(rb"\s")


class DecodeError(ValueError):
    """Bad input: status 400 (malformed), 413 (too large), 415 (unknown format), 422 (unusable)."""

    def __init__(self, status: int, code: str, detail: str):
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


@dataclass
class Frame:
    points: np.ndarray  # float32 [N, F], F >= 3: x, y, z, then intensity (and more) if present
    sensor: str  # intensity convention: "kitti" (0-1), "nuscenes" / "ouster" (0-255)
    format: str  # the wire format that was decoded


def malformed(fmt: str, detail: str) -> DecodeError:
    """400: the body does not follow the format's syntax (truncated, broken header, ...)."""
    return DecodeError(400, "malformed_body", f"{fmt}: {detail}")


def unusable(fmt: str, detail: str) -> DecodeError:
    """422: well-formed, but not a point cloud we can use (no x/y/z, wrong dtype or shape)."""
    return DecodeError(422, "unusable_body", f"{fmt}: {detail}")


def check_count(n: int, max_points: int | None, fmt: str) -> None:
    """413 when a frame holds (or declares) more than max_points points."""
    if max_points is not None and n > max_points:
        raise DecodeError(
            413, "too_many_points", f"{fmt}: {n} points exceeds the limit of {max_points}"
        )


def sensor_for(points: np.ndarray) -> str:
    """The intensity convention of a self-describing frame (pcd, ply, npy, las, pointcloud2,
    json): "ouster" (0..255) when at least BYTE_SCALE_SHARE of its finite intensities (column 3)
    exceed 1.0, else "kitti" (0..1). Frames without an intensity column are "kitti". A client
    that knows its sensor says so (the service's `sensor` parameter) instead."""
    if points.ndim != 2 or points.shape[1] < 4 or not len(points):
        return "kitti"
    col = points[:, 3]
    finite = np.count_nonzero(np.isfinite(col))
    over = np.count_nonzero((col > 1.0) & (col < np.inf))
    return "ouster" if finite and over >= BYTE_SCALE_SHARE * finite else "kitti"


def columns_frame(columns: list[np.ndarray], fmt: str) -> Frame:
    """Frame from 1-D columns (x, y, z[, intensity]) of any numeric dtype."""
    n = len(columns[0]) if columns else 0
    points = np.empty((n, len(columns)), dtype=np.float32)
    for j, col in enumerate(columns):
        points[:, j] = col
    return Frame(points, sensor_for(points), fmt)


def find_intensity(names: list[str]) -> str | None:
    """The intensity field among `names` (case-insensitive), or None."""
    lower = {n.lower(): n for n in reversed(names)}
    for cand in INTENSITY_NAMES:
        if cand in lower:
            return lower[cand]
    return None


def require_xyz(names: list[str], fmt: str) -> list[str]:
    """The names of x, y, z among `names` (case-insensitive); 422 when one is missing."""
    lower = {n.lower(): n for n in reversed(names)}
    missing = [a for a in "xyz" if a not in lower]
    if missing:
        raise unusable(fmt, f"no {'/'.join(missing)} field (fields: {', '.join(names) or 'none'})")
    return [lower[a] for a in "xyz"]


def text_chunks(data: bytes, start: int = 0, end: int | None = None):
    """Slices of data[start:end] of about TEXT_CHUNK bytes, cut at whitespace (a token is never
    split; one longer token makes one longer chunk)."""
    end = len(data) if end is None else end
    pos = start
    while pos < end:
        cut = min(pos + TEXT_CHUNK, end)
        if cut < end:
            m = _SPACE.search(data, cut, end)
            cut = m.start() if m else end
        yield data[pos:cut]
        pos = cut


def text_columns(
    data: bytes, n: int, per: int, cols: list[int], fmt: str, start: int = 0, end: int | None = None
) -> list[np.ndarray]:
    """Columns `cols` of n rows x `per` whitespace-separated numbers in data[start:end], parsed a
    chunk at a time (memory: the kept columns plus one chunk, whatever the tokens' lengths or
    the declared counts). 400 unless there are exactly n * per numbers."""
    end = len(data) if end is None else end
    if n * per > (end - start + 1) // 2:  # every value takes a character and a separator
        raise malformed(
            fmt, f"text data truncated: {end - start} bytes cannot hold {n} points x {per} values"
        )
    out = np.empty((len(cols), n), dtype=np.float32)
    seen, total = 0, n * per
    for chunk in text_chunks(data, start, end):
        tokens = chunk.split()
        if not tokens:
            continue
        if seen + len(tokens) > total:
            raise malformed(fmt, f"more than the {total} values expected ({n} x {per})")
        try:
            values = np.array(tokens, dtype=np.float64)
        except (ValueError, OverflowError):
            bad = next(t for t in tokens if not _is_number(t))
            raise malformed(fmt, f"non-numeric value {bad[:20]!r}") from None
        for j, c in enumerate(cols):
            first = (c - seen) % per
            picked = values[first::per]
            row = (seen + first) // per
            out[j, row : row + len(picked)] = picked
        seen += len(tokens)
    if seen != total:
        raise malformed(fmt, f"{seen} values, expected {n} points x {per}")
    return list(out)


def _is_number(token: bytes) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True
