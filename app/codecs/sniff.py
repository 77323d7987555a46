"""Which wire format a body is in, when the request does not say (no `format` parameter).

Rules, first match wins:
 1. unambiguous magic bytes, whatever the content type claims (clients often send a generic or
    wrong one, e.g. curl's application/x-www-form-urlencoded):
      b"\\x93NUMPY" -> npy;  b"LASF" -> las;  "ply" + newline -> ply;
      a PCD header: the first line starts with "# .PCD", "VERSION" or "FIELDS" -> pcd;
 2. a known content type (parameters such as "; charset=utf-8" ignored), see CONTENT_TYPES;
 3. weaker sniffing: printable ASCII starting with '{' or '[' -> json; a CDR encapsulation
    header (00 00 or 00 01) whose PointCloud2 structure parses -> pointcloud2;
 4. otherwise kitti (raw float32 x, y, z, intensity).
"""

from __future__ import annotations

import codecs
import re

from app.codecs import binary

CONTENT_TYPES = {
    "application/json": "json",
    "text/json": "json",
    "application/x-npy": "npy",
    "application/npy": "npy",
    "application/vnd.numpy": "npy",
    "application/x-pcd": "pcd",
    "application/pcd": "pcd",
    "text/x-pcd": "pcd",
    "application/x-ply": "ply",
    "application/ply": "ply",
    "model/x-ply": "ply",
    "text/x-ply": "ply",
    "application/vnd.las": "las",
    "application/x-las": "las",
    "application/las": "las",
    "application/x-ros2-pointcloud2": "pointcloud2",
    "application/x-pointcloud2": "pointcloud2",
    # the raw float32 layouts' own types (application/x-kitti, x-ouster, x-nuscenes, x-xyz)
    **{media: fmt for fmt, media in binary.CONTENT_TYPES.items()},
}
_PCD = re.compile(rb"\s*(#\s*\.PCD|VERSION\s|FIELDS\s)", re.IGNORECASE)
_PLY = re.compile(rb"ply\r?\n")
_TEXT = re.compile(rb"[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*")  # no control bytes (UTF-8 is fine)


def content_type_format(content_type: str | None) -> str | None:
    """The format a content type names, or None (generic or unknown types)."""
    if not content_type:
        return None
    mime = content_type.split(";", 1)[0].strip().lower()
    if mime in CONTENT_TYPES:
        return CONTENT_TYPES[mime]
    return "json" if mime.endswith("+json") else None


def magic_format(body: bytes) -> str | None:
    """Rule 1: a format with an unmistakable signature, or None."""
    if body.startswith(b"\x93NUMPY"):
        return "npy"
    if body.startswith(b"LASF"):
        return "las"
    if _PLY.match(body):
        return "ply"
    if _PCD.match(body[:64]):
        return "pcd"
    return None


def weak_format(body: bytes) -> str | None:
    """Rule 3: json or pointcloud2 by a closer look at the body, or None."""
    head = body[:256].removeprefix(codecs.BOM_UTF8)
    stripped = head.lstrip()
    if stripped[:1] in (b"{", b"[") and _TEXT.fullmatch(head):  # (a BOM or non-ASCII text: JSON)
        return "json"
    if body[:2] in (b"\x00\x00", b"\x00\x01") and len(body) >= 4:
        from app.codecs import pointcloud2
        from app.codecs.base import DecodeError

        try:
            pointcloud2.parse(body)
        except DecodeError as e:  # 422: a message past a limit (its decode says which)
            return "pointcloud2" if e.status == 422 else None
        return "pointcloud2"
    return None


def infer_format(body: bytes, content_type: str | None) -> str:
    """The format by rules 1-4 above (never fails: the fallback is kitti)."""
    return magic_format(body) or content_type_format(content_type) or weak_format(body) or "kitti"
