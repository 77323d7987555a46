"""PLY (Stanford polygon format): ascii, binary_little_endian and binary_big_endian.

The header ('ply', 'format ...', 'element NAME COUNT', 'property TYPE NAME',
'property list COUNT_TYPE ITEM_TYPE NAME', 'end_header') declares elements whose items follow in
order; the 'vertex' element gives x, y, z[, intensity] (any scalar types). Elements before the
vertex are skipped (lists included: in binary at most MAX_SKIPPED_LISTS lists in all, whose
lengths are only known list by list); whatever follows the vertices is not read. ASCII data has
one element item per line.
"""

from __future__ import annotations

import re
import struct

import numpy as np

from app.codecs.base import (
    Frame,
    check_count,
    columns_frame,
    find_intensity,
    malformed,
    require_xyz,
)
from app.codecs.base import TEXT_CHUNK, text_columns, unusable

FMT = "ply"
CONTENT_TYPE = "application/x-ply"
SCALARS = {
    "char": "i1",
    "int8": "i1",
    "uchar": "u1",
    "uint8": "u1",
    "short": "i2",
    "int16": "i2",
    "ushort": "u2",
    "uint16": "u2",
    "int": "i4",
    "int32": "i4",
    "uint": "u4",
    "uint32": "u4",
    "float": "f4",
    "float32": "f4",
    "double": "f8",
    "float64": "f8",
}
ENCODINGS = {"ascii": None, "binary_little_endian": "<", "binary_big_endian": ">"}
MAX_HEADER = 64 * 1024
# Binary lists before the vertex element (items x list properties, summed over the elements) are
# skipped one Python step each, as each list's length is only in the data: 65,536 lists (a face
# element of 65,536 faces, or 4,096 items of 16 lists) take ~20 ms. A 64 KiB header could
# otherwise declare thousands of list properties on thousands of elements (10 M steps: 13 s).
MAX_SKIPPED_LISTS = 65_536


class _Element:
    def __init__(self, name: str, count: int):
        self.name, self.count = name, count
        self.props: list[tuple[str, str, str | None]] = []  # (name, type, list count type)


def _scalar(t: str) -> str:
    if t.lower() not in SCALARS:
        raise malformed(FMT, f"unknown property type {t!r}")
    return SCALARS[t.lower()]


def _header(body: bytes) -> tuple[str, list[_Element], int]:
    end = re.search(rb"\nend_header[ \t\r]*\n", body[:MAX_HEADER])
    if end is None:
        raise malformed(FMT, "header has no end_header line")
    nl = end.end() - 1
    try:
        lines = body[:nl].decode("ascii").splitlines()
    except UnicodeDecodeError:
        raise malformed(FMT, "non-ASCII byte in the header") from None
    if not lines or lines[0].strip() != "ply":
        raise malformed(FMT, "body does not start with 'ply'")
    encoding, elements = None, []
    for line in lines[1:-1]:
        words = line.split()
        if not words or words[0] in ("comment", "obj_info"):
            continue
        if words[0] == "format" and len(words) >= 2:
            if words[1] not in ENCODINGS:
                raise malformed(FMT, f"unknown format {words[1]!r}")
            encoding = words[1]
        elif words[0] == "element" and len(words) == 3:
            if not words[2].isdigit():
                raise malformed(FMT, f"element {words[1]}: count {words[2]!r} is not an integer")
            elements.append(_Element(words[1], int(words[2])))
        elif words[0] == "property" and elements and len(words) == 3:
            elements[-1].props.append((words[2], _scalar(words[1]), None))
        elif words[0] == "property" and elements and len(words) == 5 and words[1] == "list":
            elements[-1].props.append((words[4], _scalar(words[3]), _scalar(words[2])))
        else:
            raise malformed(FMT, f"bad header line {line[:40]!r}")
    if encoding is None:
        raise malformed(FMT, "header has no format line")
    return encoding, elements, nl + 1


def decode(body: bytes, max_points: int | None = None) -> Frame:
    encoding, elements, start = _header(body)
    vertex = next((e for e in elements if e.name == "vertex"), None)
    if vertex is None:
        raise unusable(FMT, "no vertex element")
    names = [p[0] for p in vertex.props]
    wanted = require_xyz(names, FMT)
    inten = find_intensity(names)
    wanted += [inten] if inten else []
    if any(p[2] for p in vertex.props):
        raise unusable(FMT, "list properties in the vertex element are not supported")
    check_count(vertex.count, max_points, FMT)
    before = elements[: elements.index(vertex)]
    order = ENCODINGS[encoding]
    if order is None:  # ascii
        return _ascii(body, start, before, vertex, wanted)
    return _binary(memoryview(body)[start:], order, before, vertex, wanted)


def _binary(data: memoryview, order: str, before: list, vertex: _Element, wanted: list) -> Frame:
    _check_skipped_lists(before)
    pos = 0
    for el in before:
        pos = _skip_binary(data, pos, order, el)
    record = np.dtype([(name, order + t) for name, t, _ in vertex.props])
    need = vertex.count * record.itemsize
    if len(data) - pos < need:
        raise malformed(
            FMT,
            f"vertex data truncated: {len(data) - pos} bytes for "
            f"{vertex.count} vertices of {record.itemsize} bytes ({need})",
        )
    recs = np.frombuffer(data, dtype=record, count=vertex.count, offset=pos)
    return columns_frame([recs[name] for name in wanted], FMT)


def _check_skipped_lists(before: list) -> None:
    """422 when the elements before the vertices hold more than MAX_SKIPPED_LISTS lists (checked
    from the header, before any is read)."""
    lists = sum(el.count * sum(1 for p in el.props if p[2]) for el in before)
    if lists > MAX_SKIPPED_LISTS:
        raise unusable(
            FMT,
            f"the elements before the vertices hold {lists} lists (items x list properties; "
            f"at most {MAX_SKIPPED_LISTS}, read one by one; put the vertex element first)",
        )


def _skip_binary(data: memoryview, pos: int, order: str, el: _Element) -> int:
    lists, tail = _item_layout(el, order)
    if not lists:  # fixed-size items: one jump
        size = tail * el.count
        if pos + size > len(data):
            raise malformed(FMT, f"element {el.name} truncated")
        return pos + size
    for _ in range(el.count):  # each list's size is in its data: one step per list
        for scalars, length, value_size in lists:
            pos += scalars
            if pos + length.size > len(data):
                raise malformed(FMT, f"element {el.name} truncated")
            (k,) = length.unpack_from(data, pos)
            if k < 0:
                raise malformed(FMT, f"element {el.name}: negative list length")
            pos += length.size + k * value_size
        pos += tail
    if pos > len(data):
        raise malformed(FMT, f"element {el.name} truncated")
    return pos


def _item_layout(el: _Element, order: str) -> tuple[list[tuple[int, struct.Struct, int]], int]:
    """One item of `el`: for each list property (the bytes of the scalars before the list, its
    length's reader, its values' size), then the bytes of the scalars after the last list."""
    lists, scalars = [], 0
    for name, t, count_t in el.props:
        if count_t is None:
            scalars += np.dtype(t).itemsize
            continue
        if np.dtype(count_t).kind not in "iu":
            raise malformed(FMT, f"element {el.name}: list {name} has a non-integer length type")
        length = struct.Struct(order + np.dtype(count_t).char)
        lists.append((scalars, length, np.dtype(t).itemsize))
        scalars = 0
    return lists, scalars


def _skip_lines(data: bytes, pos: int, lines: int) -> int:
    """The offset after `lines` more newlines from pos (counted a chunk at a time)."""
    while lines > 0:
        chunk_end = min(pos + TEXT_CHUNK, len(data))
        found = data.count(b"\n", pos, chunk_end)
        if found < lines:
            if chunk_end == len(data):
                raise malformed(FMT, "ascii data truncated before the vertices end")
            lines -= found
            pos = chunk_end
            continue
        for _ in range(lines):  # at most TEXT_CHUNK newlines in this chunk
            pos = data.index(b"\n", pos) + 1
        lines = 0
    return pos


def _ascii(data: bytes, start: int, before: list, vertex: _Element, wanted: list) -> Frame:
    """ASCII PLY: one element item per line (as the format writes them); the lines of elements
    before the vertices are skipped, the vertex lines parsed; what follows is not read."""
    pos = _skip_lines(data, start, sum(el.count for el in before if el.props))
    end = _skip_lines(data, pos, vertex.count - 1) if vertex.count else pos
    if vertex.count:
        nl = data.find(b"\n", end)
        end = len(data) if nl < 0 else nl
    names = [p[0] for p in vertex.props]
    cols = text_columns(
        data, vertex.count, len(names), [names.index(w) for w in wanted], FMT, pos, end
    )
    return columns_frame(cols, FMT)


def encode(
    points: np.ndarray,
    encoding: str = "binary_little_endian",
    dtypes: dict | None = None,
    intensity_name: str = "intensity",
) -> tuple[bytes, str]:
    """PLY of a vertex element x, y, z[, intensity] (column 3); `dtypes` maps a property name to
    a numpy dtype (default float32)."""
    points = np.asarray(points)
    names = ["x", "y", "z"] + ([intensity_name] if points.shape[1] > 3 else [])
    ply_type = {
        "i1": "char",
        "u1": "uchar",
        "i2": "short",
        "u2": "ushort",
        "i4": "int",
        "u4": "uint",
        "f4": "float",
        "f8": "double",
    }
    order = ENCODINGS[encoding] or "<"
    dts = [np.dtype((dtypes or {}).get(name, "f4")).newbyteorder(order) for name in names]
    head = f"ply\nformat {encoding} 1.0\ncomment lidarseg\nelement vertex {len(points)}\n"
    head += "".join(f"property {ply_type[d.str[1:]]} {name}\n" for d, name in zip(dts, names))
    head += "end_header\n"
    cols = [points[:, j].astype(dt) for j, dt in enumerate(dts)]
    if encoding == "ascii":
        fmts = [("%.17g" if d.itemsize == 8 else "%.9g") if d.kind == "f" else "%d" for d in dts]
        payload = "".join(" ".join(f % v for f, v in zip(fmts, row)) + "\n" for row in zip(*cols))
        return head.encode() + payload.encode(), CONTENT_TYPE
    rec = np.empty(len(points), dtype=[(f"f{j}", dt) for j, dt in enumerate(dts)])
    for j, col in enumerate(cols):
        rec[f"f{j}"] = col
    return head.encode() + rec.tobytes(), CONTENT_TYPE
