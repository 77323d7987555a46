"""Wire codec errors beyond PCD, PLY and PointCloud2: raw binary sizes, unknown formats, npy, JSON
and LAS bodies, the point limit, and damaged bodies of every format never crashing a decoder."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

from app.codecs import DecodeError, decode
from app.codecs.encode import VARIANTS, encode
from tests.app.codec_cases import SMALL, decode_error, real_frame


@pytest.mark.parametrize("fmt,size", [("kitti", 16), ("nuscenes", 20), ("xyz", 12)])
def test_not_a_multiple_of_the_point_size(fmt, size):
    for n in (1, size - 1, 3 * size + 2):
        err = decode_error(b"\0" * n, fmt)
        assert err.status == 400 and err.code == "malformed_body" and str(size) in err.detail


def test_unknown_format():
    err = decode_error(b"\0" * 16, "laz")
    assert (err.status, err.code) == (415, "unsupported_format") and "pcd" in err.detail


def test_npy_errors():
    def npy(arr):
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=True)
        return buf.getvalue()

    for arr in (
        np.ones((5, 4), np.int32),
        np.ones((5, 4), np.float16),
        np.ones((5, 4), np.complex64),
        np.zeros(5, dtype=[("x", "f4"), ("y", "f4")]),
        np.array([[1.0, 2.0, {"a": 1}]], dtype=object),
    ):
        err = decode_error(npy(arr), "npy")
        assert err.status == 422 and "dtype" in err.detail
    for arr in (np.ones(12, np.float32), np.ones((5, 2), np.float32), np.ones((2, 3, 4))):
        err = decode_error(npy(arr))
        assert err.status == 422 and "shape" in err.detail
    good = npy(np.ones((5, 4), np.float32))
    assert decode_error(good[:-1]).status == 400 and decode_error(good + b"\0").status == 400
    assert decode_error(good[:30]).status == 400  # header cut
    assert decode_error(good.replace(b"'descr'", b"'dscr' "), "npy").status == 400
    assert decode_error(b"PK\x03\x04", "npy").status == 400  # an .npz is not an .npy


def test_json_errors():
    for body in (
        b'{"points": [[1, 2, "3"]]}',
        b"[[1, 2, null]]",
        b"[[1, 2, [3]]]",
        b"[[1, 2, true]]",
        b'{"points": [[1, 2, {}]]}',
        b"[[1, 2",
        b"\xff\xfe[",
        b"[[1, 2, 3]] trailing",
    ):
        assert decode_error(body, "json").status == 400, body
    for body in (
        b"[[1, 2], [3, 4]]",
        b"[[1, 2, 3], [1, 2]]",
        b"[1, 2, 3]",
        b'{"pts": []}',
        b'"points"',
        b'{"points": {"x": 1}}',
        b"[[1, 2, 3], 4]",
    ):
        assert decode_error(body, "json").status == 422, body
    assert decode(b'{"points": []}').points.shape == (0, 3)
    not_json = (b"+1", b".5", b"1.", b"01", b"-01", b"nan", b"inf", b"-NaN", b"1_0", b"0x1", b"3e")
    not_json += (b"1 000", b"- 1", b"2 .5e1")  # read as 1000, -1, 25 once compacted
    for value in not_json:  # Python's float() reads them all
        for shape in (b"[[1,2,%s]]", b'{"points": [[1, 2, %s]], "more": 1}'):
            assert decode_error(shape % value, "json").status == 400, (shape, value)
    rows = b",".join([b"[1.5e-3,-0,2E+2,NaN]"] * 60_000)  # over a chunk: checked in several
    assert len(decode(b"[" + rows + b"]").points) == 60_000
    err = decode_error(b"[" + rows + b",[1,2,3,+4]]", "json")
    assert err.status == 400 and "'+4'" in err.detail
    huge = b"1" * 5000  # an integer of any size is a number: infinite as a float, either shape
    for shape in (b"[[%s,2,3]]", b'{"points": [[%s, 2, 3]], "more": 1}'):
        assert decode(shape % huge, "json").points[0, 0] == np.inf
    frame = decode(b'{"points": [[1, 2, 3, 200, 7]]}')
    assert frame.points.shape == (1, 5) and frame.sensor == "ouster"


def test_las_errors():
    pytest.importorskip("laspy")
    body, _ = encode(real_frame(SMALL), "las")
    assert decode_error(body[:-40], "las").status == 400
    assert decode_error(body[:200], "las").status == 400
    assert decode_error(b"LASF" + b"\0" * 50).status == 400
    for offset, value in ((100, 0xFFFFFFFF), (107, 0xFFFFFFF), (96, 1 << 30)):
        bad = bytearray(body)  # corrupt VLR count, point count, point data offset
        struct.pack_into("<I", bad, offset, value)
        assert decode_error(bytes(bad), "las").status == 400
    laz = bytearray(body)
    laz[104] |= 0x80  # point format id bit 7: LAZ-compressed
    err = decode_error(bytes(laz), "las")
    assert err.status in (400, 415), err.detail


def test_max_points():
    points = real_frame(SMALL)
    for case in (
        "kitti",
        "pcd_binary",
        "pcd_binary_compressed",
        "ply",
        "npy",
        "las",
        "pointcloud2",
        "json",
    ):
        body, content_type = encode(points, case)
        assert len(decode(body, None, content_type, max_points=50).points) == 50
        err = decode_error(body, None, content_type, max_points=49)
        assert (err.status, err.code) == (413, "too_many_points"), case


@pytest.mark.parametrize(
    "case",
    [
        "kitti",
        "pcd_ascii",
        "pcd_binary",
        "pcd_binary_compressed",
        "ply_ascii",
        "ply_binary_big_endian",
        "npy",
        "las",
        "pointcloud2_big_endian",
        "json",
    ],
)
def test_damaged_bodies_never_crash(case):
    """Truncated or byte-flipped bodies either decode or raise a 4xx DecodeError."""
    rng = np.random.default_rng(0)
    body, content_type = encode(real_frame(SMALL), case)
    fmt = VARIANTS.get(case, (case,))[0]
    damaged = [body[:k] for k in rng.integers(0, len(body), 25)]
    for _ in range(60):
        b = bytearray(body)
        for k in rng.integers(0, min(len(b), 400), 3):
            b[k] = int(rng.integers(0, 256))
        damaged.append(bytes(b))
    for b in damaged:
        for f in (fmt, None):
            try:
                frame = decode(b, f, content_type)
            except DecodeError as e:
                assert e.status in (400, 413, 415, 422)
            else:
                assert frame.points.ndim == 2 and frame.points.shape[1] >= 3


def test_the_intensity_scale_is_a_share_not_one_value():
    from app.codecs.base import sensor_for

    unit = np.random.default_rng(0).random((1000, 4)).astype(np.float32)
    assert sensor_for(unit) == "kitti"
    unit[:9, 3] = 200.0  # 0.9 % of the points: strays in a 0..1 frame
    unit[9, 3] = np.inf
    assert sensor_for(unit) == "kitti"
    unit[10, 3] = 2.0  # 1 %: a 0..255 frame
    assert sensor_for(unit) == "ouster"
    body = unit.astype("<f4").tobytes()
    assert decode(body, "kitti", sensor="ouster").sensor == "ouster"
    err = decode_error(body, "kitti", sensor="lidar")
    assert (err.status, err.code) == (422, "unknown_sensor")


def test_reflectivity_is_the_intensity_where_a_cloud_has_both():
    """An Ouster ROS cloud: `intensity` is signal strength (thousands), `reflectivity` the
    calibrated 0..255 the Ouster convention means."""
    body = (
        b"VERSION 0.7\nFIELDS x y z intensity t reflectivity ring\nSIZE 4 4 4 4 4 4 2\n"
        b"TYPE F F F F U F U\nCOUNT 1 1 1 1 1 1 1\nWIDTH 2\nHEIGHT 1\n"
        b"VIEWPOINT 0 0 0 1 0 0 0\nPOINTS 2\nDATA ascii\n1 2 3 1500 0 40 5\n4 5 6 900 0 60 6\n"
    )
    frame = decode(body, "pcd")
    assert frame.points[:, 3].tolist() == [40.0, 60.0] and frame.sensor == "ouster"


def test_a_json_row_is_a_point_not_a_million_values():
    """A 2 MB body of one row of a million values took 54 s of a decode thread (the parse was
    quadratic in the row's width): a point has at most 64 values, refused before parsing."""
    import time

    body = b"[[" + b"1," * 999_999 + b"1]]"
    t = time.perf_counter()
    err = decode_error(body, "json")
    assert (err.status, err.code) == (422, "unusable_body") and "at most 64" in err.detail
    assert time.perf_counter() - t < 5.0  # generous: it takes milliseconds
    assert decode_error(b"[[" + b"1," * 99 + b"1]]", "json").status == 422  # the slow reader too


def test_json_with_a_bom_or_utf8_text_is_json_by_its_bytes():
    """Without a JSON Content-Type a body's bytes decide: a UTF-8 BOM or a non-ASCII key made it
    kitti floats (a 2-point frame answered as 4 garbage points)."""
    from app.codecs.sniff import infer_format

    bom = b"\xef\xbb\xbf[[1,2,0,0.5],[3,4,0,0.25]]   "
    text = '{"sensor_name": "Strasse \u00df", "points": [[1,2,0,0.5],[3,4,0,0.25]]}'.encode()
    for body in (bom, text):
        assert infer_format(body, "application/x-www-form-urlencoded") == "json"
        assert len(decode(body, None, "application/x-www-form-urlencoded").points) == 2


def test_las_pinned_to_kitti_reads_intensity_on_0_1():
    """LAS stores intensity on 16 bits and its reader gives 0..255: pinned to kitti, it was
    clamped to 1 everywhere (30 % of a frame's labels as the raw kitti body's)."""
    pytest.importorskip("laspy")
    points = real_frame(SMALL)
    body, _ = encode(points, "las")
    frame = decode(body, "las", sensor="kitti")
    assert frame.sensor == "kitti"
    np.testing.assert_allclose(frame.points[:, 3], points[:, 3], atol=1e-4)
