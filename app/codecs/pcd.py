"""PCD v0.7 (PCL's point cloud format): ascii, binary and binary_compressed.

Header lines (after optional '#' comments): VERSION, FIELDS, SIZE, TYPE, COUNT, WIDTH, HEIGHT,
VIEWPOINT, POINTS, DATA; the data follows the DATA line. Binary data is one little-endian record
per point; binary_compressed is uint32 compressed size, uint32 uncompressed size, then LZF data
that expands to the fields stored one after another (all x, then all y, ...). Organised clouds
(HEIGHT > 1) are read row after row, every point kept (invalid points stay NaN).
"""

from __future__ import annotations

import struct

import numpy as np

from app.codecs import lzf
from app.codecs.base import (
    DecodeError,
    Frame,
    check_count,
    columns_frame,
    find_intensity,
    malformed,
    require_xyz,
)
from app.codecs.base import text_columns

FMT = "pcd"
CONTENT_TYPE = "application/x-pcd"
TYPES = {
    ("F", 2): "f2",
    ("F", 4): "f4",
    ("F", 8): "f8",
    ("U", 1): "u1",
    ("U", 2): "u2",
    ("U", 4): "u4",
    ("U", 8): "u8",
    ("I", 1): "i1",
    ("I", 2): "i2",
    ("I", 4): "i4",
    ("I", 8): "i8",
}
KEYS = (
    "VERSION",
    "FIELDS",
    "SIZE",
    "TYPE",
    "COUNT",
    "WIDTH",
    "HEIGHT",
    "VIEWPOINT",
    "POINTS",
    "DATA",
)
MAX_HEADER = 64 * 1024
# binary_compressed: at most this many uncompressed bytes per allowed point (16 float32 fields)
MAX_POINT_BYTES = 64


def _header(body: bytes) -> tuple[dict[str, list[str]], int]:
    """({KEY: values}, offset of the data) — 400 when there is no DATA line."""
    pos, head = 0, {}  # type: int, dict[str, list[str]]
    while True:
        nl = body.find(b"\n", pos)
        if nl < 0 or nl > MAX_HEADER:
            raise malformed(FMT, "header has no DATA line")
        try:
            line = body[pos:nl].decode("ascii").strip()
        except UnicodeDecodeError:
            raise malformed(FMT, f"non-ASCII byte in header line {len(head) + 1}") from None
        pos = nl + 1
        if not line or line.startswith("#"):
            continue
        key, *values = line.split()
        if key.upper() not in KEYS:
            raise malformed(FMT, f"unknown header line {line[:40]!r}")
        head[key.upper()] = values
        if key.upper() == "DATA":
            return head, pos


def _int(head: dict, key: str, default: int | None = None) -> int:
    if key not in head:
        if default is None:
            raise malformed(FMT, f"header has no {key} line")
        return default
    try:
        value = int(head[key][0])
    except (ValueError, IndexError):
        raise malformed(FMT, f"{key} is not an integer: {' '.join(head[key])!r}") from None
    if value < 0:
        raise malformed(FMT, f"{key} is negative: {value}")
    return value


def _per_field(head: dict, key: str, n: int, default: list[str] | None = None) -> list[str]:
    """The header line `key`, checked to have one entry per field."""
    vals = head.get(key, default)
    if vals is None:
        raise malformed(FMT, f"header has no {key} line")
    if len(vals) != n:
        raise malformed(FMT, f"{key} has {len(vals)} entries for {n} FIELDS")
    return vals


def _layout(head: dict) -> tuple[list[str], list[np.dtype], list[int]]:
    """(field names, field dtypes, counts), checked for consistency."""
    names = head.get("FIELDS")
    if not names:
        raise malformed(FMT, "header has no FIELDS line")
    sizes = _per_field(head, "SIZE", len(names))
    types = _per_field(head, "TYPE", len(names))
    counts = _per_field(head, "COUNT", len(names), ["1"] * len(names))
    dtypes, ncount = [], []
    for name, size, typ, count in zip(names, sizes, types, counts):
        try:
            size_i, count_i = int(size), int(count)
        except ValueError:
            raise malformed(
                FMT, f"field {name}: SIZE/COUNT not integers ({size}, {count})"
            ) from None
        code = TYPES.get((typ.upper(), size_i))
        if code is None or count_i < 1:
            raise malformed(FMT, f"field {name}: unsupported TYPE {typ} SIZE {size} COUNT {count}")
        dtypes.append(np.dtype("<" + code))
        ncount.append(count_i)
    return names, dtypes, ncount


def decode(body: bytes, max_points: int | None = None) -> Frame:
    head, start = _header(body)
    names, dtypes, counts = _layout(head)
    width, height = _int(head, "WIDTH"), _int(head, "HEIGHT", 1)
    n = _int(head, "POINTS", width * height)
    if n != width * height:
        raise malformed(FMT, f"POINTS {n} != WIDTH {width} x HEIGHT {height}")
    wanted = require_xyz(names, FMT)
    inten = find_intensity(names)
    wanted += [inten] if inten else []
    check_count(n, max_points, FMT)
    kind = (head["DATA"] or [""])[0].lower()
    data = memoryview(body)[start:]
    idx = {name: names.index(name) for name in wanted}
    if kind == "ascii":
        cols = _ascii(body, start, n, counts, idx)
    elif kind == "binary":
        cols = _binary(data, n, names, dtypes, counts, idx)
    elif kind == "binary_compressed":
        cols = _compressed(data, n, dtypes, counts, idx, max_points)
    else:
        raise malformed(FMT, f"unknown DATA kind {kind!r} (ascii, binary, binary_compressed)")
    return columns_frame([cols[name] for name in wanted], FMT)


def _ascii(body: bytes, start: int, n: int, counts: list[int], idx: dict) -> dict:
    starts = np.cumsum([0] + counts)
    names = list(idx)
    cols = text_columns(body, n, int(starts[-1]), [int(starts[idx[k]]) for k in names], FMT, start)
    return dict(zip(names, cols))


def _binary(
    data: memoryview, n: int, names: list[str], dtypes: list, counts: list[int], idx: dict
) -> dict:
    record = np.dtype(
        {
            "names": [f"f{j}" for j in range(len(names))],
            "formats": [(dt, (c,)) if c > 1 else dt for dt, c in zip(dtypes, counts)],
        }
    )
    need = n * record.itemsize
    if len(data) != need:
        what = "truncated" if len(data) < need else "has trailing bytes"
        raise malformed(
            FMT,
            f"binary data {what}: {len(data)} bytes for {n} points of "
            f"{record.itemsize} bytes ({need})",
        )
    recs = np.frombuffer(data, dtype=record, count=n)
    cols = {name: recs[f"f{j}"] for name, j in idx.items()}
    return {name: col[:, 0] if col.ndim == 2 else col for name, col in cols.items()}


def _compressed(
    data: memoryview, n: int, dtypes: list, counts: list[int], idx: dict, max_points: int | None
) -> dict:
    if len(data) < 8:
        raise malformed(FMT, "binary_compressed data has no size words")
    csize, usize = struct.unpack_from("<II", data)
    point_size = sum(dt.itemsize * c for dt, c in zip(dtypes, counts))
    if usize != n * point_size:
        raise malformed(FMT, f"uncompressed size {usize} != {n} points x {point_size} bytes")
    if len(data) - 8 < csize:
        raise malformed(FMT, f"compressed data truncated: {len(data) - 8} of {csize} bytes")
    if usize and not csize:
        raise malformed(FMT, "compressed size is 0")
    if usize > lzf.MAX_RATIO * csize:
        raise malformed(
            FMT,
            f"uncompressed size {usize} is more than LZF can expand {csize} "
            f"bytes to ({lzf.MAX_RATIO}:1)",
        )
    if max_points is not None and usize > max_points * MAX_POINT_BYTES:
        raise DecodeError(
            413,
            "too_many_points",
            f"{FMT}: {usize} uncompressed bytes exceed the limit of "
            f"{max_points} points x {MAX_POINT_BYTES} bytes",
        )
    try:
        raw = lzf.decompress(data[8 : 8 + csize], usize)
    except lzf.LZFError as e:
        raise malformed(FMT, f"corrupt LZF data: {e}") from None
    out, offset = {}, 0
    for j, (dt, c) in enumerate(zip(dtypes, counts)):
        block = np.frombuffer(raw, dtype=dt, count=n * c, offset=offset).reshape(n, c)
        offset += n * c * dt.itemsize
        for name, k in idx.items():
            if k == j:
                out[name] = block[:, 0]
    return out


def encode(
    points: np.ndarray,
    data: str = "binary",
    width: int | None = None,
    height: int = 1,
    dtypes: dict | None = None,
    intensity_name: str = "intensity",
    lzf_matches: bool = False,
) -> tuple[bytes, str]:
    """PCD v0.7 of x, y, z[, intensity] (column 3). `dtypes` maps a field name to a numpy dtype
    (default float32); width x height organises the cloud (default width = N, height = 1)."""
    points = np.asarray(points)
    n = len(points)
    width = n // max(height, 1) if width is None else width
    if width * height != n:
        raise ValueError(f"width {width} x height {height} != {n} points")
    names = ["x", "y", "z"] + ([intensity_name] if points.shape[1] > 3 else [])
    dts = [np.dtype((dtypes or {}).get(name, "f4")).newbyteorder("<") for name in names]
    typ = {"f": "F", "u": "U", "i": "I"}
    head = (
        "# .PCD v0.7 - Point Cloud Data file format\nVERSION 0.7\n"
        f"FIELDS {' '.join(names)}\nSIZE {' '.join(str(d.itemsize) for d in dts)}\n"
        f"TYPE {' '.join(typ[d.kind] for d in dts)}\nCOUNT {' '.join('1' for _ in dts)}\n"
        f"WIDTH {width}\nHEIGHT {height}\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS {n}\nDATA {data}\n"
    )
    cols = [points[:, j].astype(dt) for j, dt in enumerate(dts)]
    if data == "ascii":
        fmts = [("%.17g" if d.itemsize == 8 else "%.9g") if d.kind == "f" else "%d" for d in dts]
        lines = "\n".join(" ".join(f % v for f, v in zip(fmts, row)) for row in zip(*cols))
        payload = (lines + "\n").encode() if n else b""
    elif data == "binary":
        rec = np.empty(n, dtype=[(f"f{j}", dt) for j, dt in enumerate(dts)])
        for j, col in enumerate(cols):
            rec[f"f{j}"] = col
        payload = rec.tobytes()
    elif data == "binary_compressed":
        raw = b"".join(col.tobytes() for col in cols)
        comp = lzf.compress(raw, matches=lzf_matches)
        payload = struct.pack("<II", len(comp), len(raw)) + comp
    else:
        raise ValueError(f"unknown PCD data kind {data!r}")
    return head.encode() + payload, CONTENT_TYPE
