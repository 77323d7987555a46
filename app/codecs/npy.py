"""NPY (numpy's array file, format versions 1-3): a float32 or float64 array [N, 3+].

The header is read first, so a wrong dtype or shape is refused before any data is read; pickled
(object) arrays are never loaded.
"""

from __future__ import annotations

import io

import numpy as np

from app.codecs.base import Frame, check_count, malformed, sensor_for, unusable

FMT = "npy"
CONTENT_TYPE = "application/x-npy"
MAGIC = b"\x93NUMPY"


def decode(body: bytes, max_points: int | None = None) -> Frame:
    if not body.startswith(MAGIC):
        raise malformed(FMT, "body does not start with the NPY magic b'\\x93NUMPY'")
    fp = io.BytesIO(body)
    try:
        version = np.lib.format.read_magic(fp)
        read = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )  # versions 2.0 and 3.0: 4-byte length
        shape, fortran, dtype = read(fp)
    except Exception as e:  # numpy's header parser raises many types (tokenize.TokenError...)
        raise malformed(FMT, f"bad NPY header: {e}") from None
    if (
        dtype.hasobject
        or dtype.names is not None
        or dtype.subdtype is not None
        or dtype.kind != "f"
        or dtype.itemsize not in (4, 8)
    ):
        raise unusable(FMT, f"dtype {dtype} is not supported; send float32 or float64")
    if len(shape) != 2 or shape[1] < 3:
        raise unusable(FMT, f"shape {shape} is not [N, 3+] (points x (x, y, z, ...))")
    check_count(shape[0], max_points, FMT)
    need = shape[0] * shape[1] * dtype.itemsize
    have = len(body) - fp.tell()
    if have != need:
        what = "truncated" if have < need else "has trailing bytes"
        raise malformed(FMT, f"data {what}: {have} bytes for shape {shape} {dtype} ({need})")
    order = "F" if fortran else "C"
    arr = np.frombuffer(body, dtype=dtype, count=shape[0] * shape[1], offset=fp.tell())
    points = arr.reshape(shape, order=order).astype(np.float32, order="C")  # type: ignore[call-overload]
    return Frame(points, sensor_for(points), FMT)


def encode(points: np.ndarray, dtype: str = "<f4") -> tuple[bytes, str]:
    """np.save of the points as `dtype` (float32 by default; '>f8' etc. work too)."""
    buf = io.BytesIO()
    np.save(buf, np.asarray(points).astype(dtype), allow_pickle=False)
    return buf.getvalue(), CONTENT_TYPE
