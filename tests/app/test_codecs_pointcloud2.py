"""PointCloud2 codec: byte for byte against rosbags (an independent CDR implementation), and every
inconsistent or broken message answering the right 4xx status."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from app.codecs import decode, pointcloud2
from app.codecs.encode import encode
from tests.app.codec_cases import SMALL, decode_error, real_frame


def test_pointcloud2_matches_rosbags():
    typesys = pytest.importorskip("rosbags.typesys")
    store = typesys.get_typestore(typesys.Stores.ROS2_HUMBLE)
    msgtype = "sensor_msgs/msg/PointCloud2"
    points = real_frame(SMALL)
    for kw in (
        {},
        {"big_endian": True, "height": 5, "row_padding": 3, "point_padding": 2},
        {"dtypes": {"x": "f8", "intensity": "u2"}, "frame_id": "abc"},
        {"frame_id": "", "data_big_endian": True},
        {"frame_id": "os_lidar_0"},
    ):
        ours, _ = encode(points, "pointcloud2", **kw)
        msg = store.deserialize_cdr(ours, msgtype)
        assert (msg.height, msg.width) == (kw.get("height", 1), 50 // kw.get("height", 1))
        theirs = store.serialize_cdr(msg, msgtype, little_endian=not kw.get("big_endian"))
        assert theirs == ours  # byte for byte, alignment included
    # a message built by rosbags: odd frame_id, padded rows, fields out of order, big-endian
    Field = store.types["sensor_msgs/msg/PointField"]
    data = np.zeros((2, 3 * 20 + 5), np.uint8)
    view = np.ndarray((2, 3), ">f4", data, 8, (65, 20))
    view[...] = np.arange(6).reshape(2, 3)
    msg = store.types[msgtype](
        header=store.types["std_msgs/msg/Header"](
            stamp=store.types["builtin_interfaces/msg/Time"](sec=1, nanosec=2), frame_id="ab"
        ),
        height=2,
        width=3,
        is_bigendian=True,
        point_step=20,
        row_step=65,
        is_dense=False,
        fields=[
            Field(name="reflectivity", offset=16, datatype=4, count=1),
            Field(name="z", offset=0, datatype=7, count=1),
            Field(name="x", offset=8, datatype=7, count=1),
            Field(name="y", offset=12, datatype=3, count=1),
        ],
        data=data.reshape(-1),
    )
    for little in (True, False):
        frame = decode(store.serialize_cdr(msg, msgtype, little_endian=little))
        assert frame.format == "pointcloud2" and frame.points.shape == (6, 4)
        np.testing.assert_array_equal(frame.points[:, 0], np.arange(6))


def _pc2_patch(body: bytes, **values) -> bytes:
    """A PointCloud2 body with some uint32 fields overwritten (little-endian CDR)."""
    msg = pointcloud2.parse(body)
    pos = {
        "point_step": msg.data_offset - 12,
        "row_step": msg.data_offset - 8,
        "data_size": msg.data_offset - 4,
    }
    hpos = 4 + 12 + len(msg.frame_id) + 1
    pos["height"] = hpos + (-(hpos - 4)) % 4
    pos["width"] = pos["height"] + 4
    out = bytearray(body)
    for key, value in values.items():
        struct.pack_into("<I", out, pos[key], value)
    return bytes(out)


@pytest.mark.parametrize(
    "patch",
    [
        {"row_step": 15 * 10},
        {"point_step": 0},
        {"point_step": 8, "row_step": 80},
        {"height": 6},
        {"width": 11},
        {"data_size": 10_000},
        {"data_size": 3},
        {"row_step": 17 * 10},
        {"height": 0},
        {"height": 1 << 31},
    ],
)
def test_inconsistent_pointcloud2(patch):
    points = real_frame(SMALL)
    body, _ = encode(points, "pointcloud2", height=5)  # width 10, point_step 16, row_step 160
    assert decode(_pc2_patch(body)).points.shape == (50, 4)
    err = decode_error(_pc2_patch(body, **patch), "pointcloud2")
    assert err.status == 400, err.detail


def test_broken_pointcloud2():
    body, _ = encode(real_frame(SMALL), "pointcloud2")
    assert decode_error(body[:-3], "pointcloud2").status == 400  # truncated: no is_dense
    assert decode_error(body[:40], "pointcloud2").status == 400
    assert decode_error(b"\x01\x00" + body[2:], "pointcloud2").status == 400  # not plain CDR
    at = body.index(b"\x0c\x00\x00\x00\x07", body.index(b"intensity\x00")) + 4
    bad_type = body[:at] + b"\x09" + body[at + 1 :]  # intensity: datatype 9 (no such type)
    assert decode_error(bad_type, "pointcloud2").status == 400
    no_x = body.replace(b"\x02\x00\x00\x00x\x00", b"\x02\x00\x00\x00q\x00")
    assert decode_error(no_x, "pointcloud2").status == 422
