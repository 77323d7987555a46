"""Reading frames from files for the command line: .npy, .bin files in the wire's raw float32
layouts (app/codecs/binary.py, by the file's name), and every other file through the service's
decoders (PCD, PLY, LAS, JSON, ...: the format from --format, else from the file's bytes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.codecs import decode
from app.codecs.sniff import magic_format, weak_format


# A .bin file's raw layout by its lower-case name: the first hint found in it, else kitti. The
# dashboard's file drop gets this table from /v1/requests (one rule for the CLI and the page).
RAW_LAYOUT_HINTS = (
    (".pcd.bin", "nuscenes"),
    ("lidar_top", "nuscenes"),
    ("os1", "ouster"),
    ("ouster", "ouster"),
)
RAW_LAYOUT_DEFAULT = "kitti"


def infer_format(path: Path) -> str | None:
    """A format by the file's name: .npy, a .bin file's raw layout (RAW_LAYOUT_HINTS: nuScenes'
    .pcd.bin, an Ouster's scans, else kitti); None for any other name (its bytes tell)."""
    name = path.name.lower()
    if name.endswith(".npy"):
        return "npy"
    if not name.endswith(".bin"):
        return None
    return next((fmt for hint, fmt in RAW_LAYOUT_HINTS if hint in name), RAW_LAYOUT_DEFAULT)


def posting_format(path: Path, fmt: str | None = None) -> str | None:
    """The format to post a file as: `fmt` if given; a .bin file's raw layout by its name
    (nuScenes' .pcd.bin, an Ouster's scans, else kitti); else None, for the service to infer
    from the bytes."""
    if fmt is None and path.name.lower().endswith(".bin"):
        return infer_format(path)
    return fmt


def read_frame(
    path: str | Path, fmt: str | None = None, sensor: str | None = None
) -> tuple[np.ndarray, str]:
    """(points float32 [N, F], sensor name) of a frame file, decoded as the service decodes a
    body: `fmt`, else the format its name says (infer_format), else the one its bytes show
    (PCD, PLY, LAS, .npy, JSON, PointCloud2); ValueError (the codecs' DecodeError is one) for a
    file that is none of them, a truncated one or one without points. (Until 2026-12-06 an .npy
    was read as KITTI's 0..1 intensities whatever its values: an Ouster scan's labels agreed
    with the service's on 2.7 % of its points.) `sensor` pins the intensity convention."""
    path = Path(path)
    fmt = fmt or infer_format(path)
    body = path.read_bytes()
    fmt = fmt or magic_format(body) or weak_format(body)
    if fmt is None:
        raise ValueError(f"{path}: its name and bytes name no format; give one with --format")
    frame = decode(body, fmt, sensor=sensor)
    if not len(frame.points):
        raise ValueError(f"{path}: no points")
    points = frame.points if frame.points.flags.writeable else frame.points.copy()  # a view
    return points, frame.sensor
