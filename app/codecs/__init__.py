"""Wire formats of a posted frame -> float32 points [N, F] (x, y, z first, then intensity...).

decode(body, fmt, content_type) is the one entry point the routes call. Every failure is a
DecodeError carrying the HTTP status and a short error code, so the service answers 4xx with a
JSON body that says what is wrong and never 500 on bad input:
  400 malformed_body      the body breaks the format's syntax (truncated, broken header, ...)
  413 too_many_points     more points than decode(..., max_points=) allows
  415 unsupported_format  unknown format name (or LAS without laspy / LAZ without a backend)
  422 unusable_body       well-formed, but not usable points (no x/y/z, wrong dtype or shape)

Formats (one module each): kitti, ouster, nuscenes, xyz (binary.py), pcd, ply, npy, las,
pointcloud2, json (json_points.py). With fmt=None the format is inferred (sniff.py: magic bytes,
content type, else kitti). The raw float formats fix the sensor (kitti, ouster, nuscenes; xyz ->
kitti); the self-describing ones report sensor "kitti" (intensity 0..1) unless at least 1 % of
their intensities exceed 1.0 (base.BYTE_SCALE_SHARE), then "ouster" (0..255); a caller that
knows the sensor passes `sensor` (one of base.SENSORS), and it holds for any format. Decoded
points are x, y, z, then intensity when the body has one (pcd / ply / pointcloud2: a field named
'reflectivity', else 'intensity', else 'i'); npy and json keep every column. Points are never
dropped or reordered (invalid ones stay NaN), so per-point results line up with the client's
points. encode.py writes every format (tests, client CLI).
"""

from __future__ import annotations

import struct

from app.codecs import binary, json_points, las, npy, pcd, ply, pointcloud2
from app.codecs.base import SENSORS, DecodeError, Frame, check_count
from app.codecs.sniff import infer_format

__all__ = ["DecodeError", "Frame", "FORMATS", "SENSORS", "decode", "infer_format"]

FORMATS = (*binary.LAYOUTS, "pcd", "ply", "npy", "las", "pointcloud2", "json")
_DECODERS = {
    "pcd": pcd.decode,
    "ply": ply.decode,
    "npy": npy.decode,
    "las": las.decode,
    "pointcloud2": pointcloud2.decode,
    "json": json_points.decode,
}


def decode(
    body: bytes,
    fmt: str | None = None,
    content_type: str | None = None,
    *,
    max_points: int | None = None,
    sensor: str | None = None,
) -> Frame:
    """Decodes one frame; fmt=None infers it from the content type and magic bytes.
    max_points: 413 for a frame with more points (checked before the data is converted where
    the format declares its size). sensor: the intensity convention to read it in (one of
    SENSORS; 422 otherwise), else the format's or the guess from its values."""
    if sensor is not None and sensor not in SENSORS:
        raise DecodeError(
            422, "unknown_sensor", f"unknown sensor {sensor!r}; known: {', '.join(SENSORS)}"
        )
    body = bytes(body) if not isinstance(body, bytes) else body
    fmt = fmt.strip().lower() if fmt else infer_format(body, content_type)
    if fmt not in FORMATS:
        raise DecodeError(
            415, "unsupported_format", f"unknown format {fmt!r}; supported: {', '.join(FORMATS)}"
        )
    try:
        if fmt in binary.LAYOUTS:
            frame = binary.decode(body, fmt, max_points)
        else:
            frame = _DECODERS[fmt](body, max_points)
    except DecodeError:
        raise
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, struct.error) as e:
        # a safety net: every expected failure is a DecodeError already
        raise DecodeError(400, "malformed_body", f"{fmt}: cannot decode: {e}") from None
    check_count(len(frame.points), max_points, fmt)
    if sensor is not None:
        if fmt == "las" and sensor == "kitti":  # the only codec that scales intensity itself
            frame = las.on_unit_scale(frame)
        frame.sensor = sensor
    return frame
