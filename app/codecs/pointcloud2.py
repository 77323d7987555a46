"""ROS 2 sensor_msgs/msg/PointCloud2, CDR-serialised as rosbag2 stores a message.

Layout: a 4-byte encapsulation header (0x00 0x00 = big-endian CDR, 0x00 0x01 = little-endian),
then the message: std_msgs/Header (int32 sec, uint32 nanosec, string frame_id), uint32 height,
uint32 width, PointField[] fields (string name, uint32 offset, uint8 datatype, uint32 count),
bool is_bigendian, uint32 point_step, uint32 row_step, uint8[] data, bool is_dense. Strings are
a uint32 length (including the NUL) and the bytes; sequences a uint32 length and the items.
Every primitive is aligned to its size, counted from the start of the message after the 4-byte
header. Point fields are read by name and offset in each point_step record of each row_step row
(rows may be padded), in the byte order is_bigendian gives.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from app.codecs.base import (
    Frame,
    check_count,
    columns_frame,
    find_intensity,
    malformed,
    require_xyz,
    unusable,
)

FMT = "pointcloud2"
CONTENT_TYPE = "application/x-ros2-pointcloud2"
# sensor_msgs/PointField datatypes: INT8 .. FLOAT64
DATATYPES = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 8: "f8"}
HEADERS = {b"\x00\x00": ">", b"\x00\x01": "<"}
# Fields a message may declare: ROS drivers send a handful to a few dozen (x, y, z, intensity,
# ring, t, ...) and each becomes Python objects, so 1,024 keep a parse (sniffing parses too) to
# about a millisecond, where a 64 MiB body could declare 2.7 million (8 s and +570 MB, twice
# the time when sniffed).
MAX_FIELDS = 1024
# A field name's bytes, its NUL included: names are identifiers ('x', 'intensity'), and 1,024
# names of 256 bytes keep the field list (and an error that lists it) within 256 KiB.
MAX_NAME_BYTES = 256


@dataclass
class Message:
    height: int
    width: int
    fields: list[tuple[str, int, int, int]]  # (name, offset, datatype, count)
    is_bigendian: bool
    point_step: int
    row_step: int
    data_offset: int  # where data starts in the body
    data_size: int
    frame_id: str


class _Reader:
    def __init__(self, body: bytes, order: str):
        self.body, self.order, self.pos = body, order, 4

    def _get(self, code: str):
        size = struct.calcsize(code)
        self.pos += (-(self.pos - 4)) % size  # align relative to the message start
        if self.pos + size > len(self.body):
            raise malformed(FMT, f"message truncated at byte {self.pos}")
        (value,) = struct.unpack_from(self.order + code, self.body, self.pos)
        self.pos += size
        return value

    def u8(self) -> int:
        return self._get("B")

    def u32(self) -> int:
        return self._get("I")

    def string(self, limit: int | None = None, what: str = "string") -> str:
        """A string; 422 for one of more than `limit` bytes (its NUL included)."""
        n = self.u32()
        if limit is not None and n > limit:
            raise unusable(FMT, f"{what} at byte {self.pos - 4} has {n} bytes (at most {limit})")
        if n < 1 or self.pos + n > len(self.body) or self.body[self.pos + n - 1] != 0:
            raise malformed(FMT, f"bad string at byte {self.pos - 4} (length {n})")
        raw = self.body[self.pos : self.pos + n - 1]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise malformed(FMT, f"string at byte {self.pos - n} is not UTF-8") from None


def parse(body: bytes) -> Message:
    """The message's structure, checked for consistency (the data is not converted)."""
    if len(body) < 4 or body[:2] not in HEADERS:
        raise malformed(FMT, "no CDR encapsulation header (00 00 or 00 01)")
    r = _Reader(body, HEADERS[body[:2]])
    r._get("i")  # stamp.sec
    r.u32()  # stamp.nanosec
    frame_id = r.string()
    height, width = r.u32(), r.u32()
    nfields = r.u32()
    if nfields * 13 > len(body):
        raise malformed(FMT, f"{nfields} fields cannot fit in {len(body)} bytes")
    if nfields > MAX_FIELDS:  # before any field becomes Python objects
        raise unusable(FMT, f"{nfields} fields (at most {MAX_FIELDS})")
    fields = [_field(r) for _ in range(nfields)]
    is_bigendian = bool(r.u8())
    point_step, row_step = r.u32(), r.u32()
    data_size = r.u32()
    data_offset = r.pos
    if data_offset + data_size > len(body):
        raise malformed(FMT, f"data truncated: {len(body) - data_offset} of {data_size} bytes")
    r.pos += data_size
    r.u8()  # is_dense
    msg = Message(
        height, width, fields, is_bigendian, point_step, row_step, data_offset, data_size, frame_id
    )
    _check(msg)
    return msg


def _field(r: _Reader) -> tuple[str, int, int, int]:
    """One PointField: (name, offset, datatype, count)."""
    return r.string(MAX_NAME_BYTES, "field name"), r.u32(), r.u8(), r.u32()


def _check(m: Message) -> None:
    if m.width and m.height:
        if m.point_step == 0:
            raise malformed(FMT, "point_step is 0")
        if m.row_step < m.width * m.point_step:
            raise malformed(
                FMT, f"row_step {m.row_step} < width {m.width} x point_step {m.point_step}"
            )
    if m.data_size != m.height * m.row_step:
        raise malformed(
            FMT,
            f"data has {m.data_size} bytes, expected height {m.height} x "
            f"row_step {m.row_step} = {m.height * m.row_step}",
        )
    for name, offset, datatype, count in m.fields:
        if datatype not in DATATYPES:
            raise malformed(FMT, f"field {name!r}: unknown datatype {datatype}")
        if not m.width * m.height:
            continue  # an empty cloud's layout is never used
        end = offset + np.dtype(DATATYPES[datatype]).itemsize * max(count, 1)
        if end > m.point_step:
            raise malformed(
                FMT,
                f"field {name!r} (offset {offset}, ends at {end}) does not fit "
                f"in point_step {m.point_step}",
            )


def decode(body: bytes, max_points: int | None = None) -> Frame:
    m = parse(body)
    names = [f[0] for f in m.fields]
    wanted = require_xyz(names, FMT)
    inten = find_intensity(names)
    wanted += [inten] if inten else []
    n = m.height * m.width
    check_count(n, max_points, FMT)
    order = ">" if m.is_bigendian else "<"
    cols = []
    for name in wanted:
        _, offset, datatype, _ = m.fields[names.index(name)]
        dt = np.dtype(order + DATATYPES[datatype])
        if n == 0:
            cols.append(np.empty(0, dt))
            continue
        view = np.ndarray(
            (m.height, m.width),
            dtype=dt,
            buffer=body,
            offset=m.data_offset + offset,
            strides=(m.row_step, m.point_step),
        )
        cols.append(view.reshape(-1))
    return columns_frame(cols, FMT)


class _Writer:
    def __init__(self, order: str):
        self.order, self.buf = order, bytearray()

    def put(self, code: str, value) -> None:
        size = struct.calcsize(code)
        self.buf.extend(bytes((-len(self.buf)) % size))
        self.buf.extend(struct.pack(self.order + code, value))

    def string(self, s: str) -> None:
        raw = s.encode() + b"\x00"
        self.put("I", len(raw))
        self.buf.extend(raw)


def encode(
    points: np.ndarray,
    big_endian: bool = False,
    data_big_endian: bool | None = None,
    height: int = 1,
    row_padding: int = 0,
    point_padding: int = 0,
    dtypes: dict | None = None,
    intensity_name: str = "intensity",
    frame_id: str = "lidar",
) -> tuple[bytes, str]:
    """CDR PointCloud2 of x, y, z[, intensity] (column 3). big_endian: the CDR byte order;
    data_big_endian: is_bigendian of the point data (default: same as the CDR); height splits
    the points into rows, each padded by row_padding bytes; point_padding pads each point;
    `dtypes` maps a field name to a numpy dtype (default float32)."""
    points = np.asarray(points)
    n = len(points)
    width = n // height if height else 0
    if width * height != n:
        raise ValueError(f"{n} points do not split into {height} rows")
    data_be = big_endian if data_big_endian is None else data_big_endian
    dorder = ">" if data_be else "<"
    names = ["x", "y", "z"] + ([intensity_name] if points.shape[1] > 3 else [])
    dts = [np.dtype((dtypes or {}).get(name, "f4")).newbyteorder(dorder) for name in names]
    codes = {v: k for k, v in DATATYPES.items()}
    offsets = np.cumsum([0] + [d.itemsize for d in dts])
    point_step = int(offsets[-1]) + point_padding
    row_step = width * point_step + row_padding
    data = np.zeros((height, row_step), dtype=np.uint8)
    for j, dt in enumerate(dts if n else []):
        col = points[:, j].astype(dt).reshape(height, width)
        view = np.ndarray(
            (height, width),
            dtype=dt,
            buffer=data,
            offset=int(offsets[j]),
            strides=(row_step, point_step),
        )
        view[...] = col
    w = _Writer(">" if big_endian else "<")
    w.put("i", 0)
    w.put("I", 0)
    w.string(frame_id)
    w.put("I", height)
    w.put("I", width)
    w.put("I", len(names))
    for name, dt, off in zip(names, dts, offsets):
        w.string(name)
        w.put("I", int(off))
        w.put("B", codes[dt.str[1:]])
        w.put("I", 1)
    w.put("B", int(data_be))
    w.put("I", point_step)
    w.put("I", row_step)
    w.put("I", data.size)
    w.buf.extend(data.tobytes())
    w.put("B", 1)
    return (b"\x00\x01\x00\x00" if not big_endian else b"\x00\x00\x00\x00") + bytes(
        w.buf
    ), CONTENT_TYPE
