"""LAS (ASPRS LiDAR exchange format, read with laspy): scaled x, y, z and intensity.

LAS stores intensity as uint16 normalised to the full 16-bit range (LAS 1.4 spec), so it is
decoded as intensity / 257, i.e. on the 0..255 scale (sensor "ouster" once 1 % of the values
exceed 1); a frame pinned to kitti's 0..1 (the `sensor` parameter) is divided by 255 more
(on_unit_scale: 65535 to 1, as the encoder wrote it).
The encoder writes 0..1 intensities (max <= 1) as value * 65535 and larger ones as value * 257,
so that a decoded frame's intensity, normalised for its sensor, matches the original's.
LAZ (compressed LAS) needs a laspy backend (lazrs or laszip); without one it is refused (415).
Without laspy installed at all, the format answers 415.
"""

from __future__ import annotations

import io
import struct

import numpy as np

from app.codecs.base import DecodeError, Frame, check_count, malformed, sensor_for

try:
    import laspy
except ImportError:  # pragma: no cover - exercised only where laspy is missing
    laspy = None

FMT = "las"
CONTENT_TYPE = "application/vnd.las"
MAGIC = b"LASF"


def _require_laspy() -> None:
    if laspy is None:
        raise DecodeError(
            415,
            "unsupported_format",
            "las: the server cannot read LAS (the laspy package is not installed)",
        )


def decode(body: bytes, max_points: int | None = None) -> Frame:
    _require_laspy()
    if not body.startswith(MAGIC):
        raise malformed(FMT, "body does not start with 'LASF'")
    _check_header(body)
    try:
        with laspy.open(io.BytesIO(body)) as reader:
            header = reader.header
            check_count(int(header.point_count), max_points, FMT)
            las = reader.read()
    except DecodeError:
        raise
    except Exception as e:  # laspy raises assorted errors on corrupt input
        if len(body) > 104 and body[104] & 0x80:  # point format id bit 7: LAZ-compressed
            raise DecodeError(
                415,
                "unsupported_format",
                f"las: compressed LAZ cannot be read here ({e}); send plain LAS",
            ) from None
        raise malformed(FMT, f"cannot read LAS: {type(e).__name__}: {e}") from None
    n = len(las.points)
    if n != int(header.point_count):
        raise malformed(FMT, f"truncated: {n} of {header.point_count} points")
    points = np.empty((n, 4), dtype=np.float32)
    with np.errstate(over="ignore"):  # absurd scales give inf, which the pipeline ignores
        points[:, 0], points[:, 1], points[:, 2] = las.x, las.y, las.z
    points[:, 3] = np.asarray(las.intensity, dtype=np.float32) / np.float32(257.0)
    return Frame(points, sensor_for(points), FMT)


def on_unit_scale(frame: Frame) -> Frame:
    """A decoded LAS frame's intensity (0..255 from decode's / 257) on 0..1, pinned to kitti: the
    file's 0..65535 / 65535. Changes the frame in place and returns it."""
    frame.points[:, 3] /= np.float32(255.0)
    return frame


def _check_header(body: bytes) -> None:
    """Sizes in the public header block checked against the body before laspy reads it (laspy
    loops over a corrupt VLR count, and trusts the point count)."""
    if len(body) < 227:
        raise malformed(FMT, f"{len(body)} bytes is too short for a LAS header (227)")
    minor = body[25]
    header_size, data_offset, n_vlr = struct.unpack_from("<HII", body, 94)
    record_length, n_points = struct.unpack_from("<HI", body, 105)
    if minor >= 4 and len(body) >= 255 and not n_points:
        n_points = struct.unpack_from("<Q", body, 247)[0]
    if header_size < 227 or data_offset < header_size or data_offset > len(body):
        raise malformed(FMT, f"bad header size {header_size} / point data offset {data_offset}")
    if header_size + n_vlr * 54 > data_offset:
        raise malformed(FMT, f"{n_vlr} VLRs cannot fit before the point data at {data_offset}")
    if n_points * record_length > len(body) - data_offset:
        raise malformed(
            FMT,
            f"truncated: {n_points} points of {record_length} bytes need "
            f"{n_points * record_length}, body has {len(body) - data_offset}",
        )
    if minor >= 4 and len(body) >= 247:
        evlr_start, n_evlr = struct.unpack_from("<QI", body, 235)
        if n_evlr and evlr_start + n_evlr * 60 > len(body):
            raise malformed(FMT, f"{n_evlr} extended VLRs cannot fit in the body")


def encode(points: np.ndarray, scale: float = 1e-5) -> tuple[bytes, str]:
    """LAS 1.2 point format 0; coordinates stored as int32 * `scale` around the cloud's centre."""
    _require_laspy()
    points = np.asarray(points, dtype=np.float64)
    header = laspy.LasHeader(point_format=0, version="1.2")
    centre = np.round((points[:, :3].min(0) + points[:, :3].max(0)) / 2) if len(points) else 0
    header.offsets = np.zeros(3) + centre
    header.scales = np.full(3, scale)
    las = laspy.LasData(header)
    las.x, las.y, las.z = points[:, 0], points[:, 1], points[:, 2]
    if points.shape[1] > 3:
        inten = np.nan_to_num(points[:, 3])
        factor = 65535.0 if (not len(inten) or inten.max() <= 1.0) else 257.0
        las.intensity = np.clip(np.round(inten * factor), 0, 65535).astype(np.uint16)
    buf = io.BytesIO()
    las.write(buf)
    return buf.getvalue(), CONTENT_TYPE
