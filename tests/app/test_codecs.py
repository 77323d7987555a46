"""Wire codecs (app/codecs): round trips of the real frames through every format and variant,
format inference, and every error case answering the right 4xx status."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

from app.codecs import DecodeError, decode, infer_format, lzf, pointcloud2
from app.codecs.encode import VARIANTS, encode
from tests.conftest import FRAMES, frame_id, load_frame, require_real_data

NAMES = [name for name, _ in FRAMES]
SMALL = "semantickitti/seq00_000000_subset50.bin"
NUSC = next(n for n in NAMES if n.startswith("nuscenes/"))
# intensity convention of each frame: the self-describing formats report "ouster" for 0..255
RULE_SENSOR = {
    "seq00_000000": "kitti",
    "spvnas_000000": "kitti",
    "seq00_000000_subset50": "kitti",
    "nuscenes": "ouster",
    "os1-128_lb_n3_scan0_xyzr": "ouster",
}
ASCII = {"pcd_ascii", "ply_ascii", "json", "json_bare"}
CASES = [
    "kitti",
    "nuscenes",
    "xyz",
    "pcd",
    "ply",
    "npy",
    "las",
    "pointcloud2",
    "json",
    "json_bare",
    "pointcloud2_padded",
    *VARIANTS,
]


def _frame(name: str) -> np.ndarray:
    require_real_data()
    return load_frame(name)


def _expected(points: np.ndarray, case: str) -> np.ndarray:
    fmt = VARIANTS.get(case, (case.split("_")[0],))[0]
    if fmt in ("kitti", "nuscenes", "xyz"):
        width = {"kitti": 4, "nuscenes": 5, "xyz": 3}[fmt]
        out = np.zeros((len(points), width), np.float32)
        out[:, : min(width, points.shape[1])] = points[:, :width]
        return out
    return points if fmt in ("npy", "json") else points[:, :4]


def _encode(points: np.ndarray, case: str) -> tuple[bytes, str]:
    if case == "json_bare":
        return encode(points, "json", wrap=False)
    if case == "pointcloud2_padded":  # rows of 2 points... padded by 7 bytes, data big-endian
        return encode(
            points,
            "pointcloud2",
            height=len(points) // 2 if len(points) % 2 == 0 else 1,
            row_padding=7,
            point_padding=3,
            data_big_endian=True,
        )
    return encode(points, case)


def _error(
    body: bytes, fmt: str | None = None, content_type: str | None = None, **kw
) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        decode(body, fmt, content_type, **kw)
    return info.value


# ---- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", NAMES, ids=frame_id)
def test_round_trip(name, case):
    points = _frame(name)
    if case in ASCII and len(points) > 40000:
        points = points[::4]  # ascii text of a whole frame is slow and proves nothing more
    body, content_type = _encode(points, case)
    frame = decode(body, None, content_type)  # the content type alone names the format
    fmt = VARIANTS.get(case, (case.split("_")[0],))[0]
    assert frame.format == fmt
    assert frame.points.dtype == np.float32 and frame.points.flags.c_contiguous
    expected = _expected(points, case)
    if fmt == "las":  # int32 coordinates at 1e-5 m; intensity on the 0..255 scale
        assert frame.points.shape == expected.shape
        np.testing.assert_allclose(frame.points[:, :3], expected[:, :3], rtol=0, atol=2e-5)
        scale = 255.0 if RULE_SENSOR[frame_id(name)] == "ouster" else 1.0
        np.testing.assert_allclose(
            frame.points[:, 3] / 255.0, expected[:, 3] / scale, rtol=0, atol=1e-4
        )
        assert frame.sensor == "ouster"
        return
    np.testing.assert_array_equal(frame.points, expected)
    if fmt in ("kitti", "nuscenes"):
        assert frame.sensor == fmt
    elif fmt == "xyz":
        assert frame.sensor == "kitti"
    else:
        assert frame.sensor == RULE_SENSOR[frame_id(name)]
    if fmt not in ("kitti", "nuscenes", "xyz"):  # self-describing: magic bytes / structure
        assert decode(body).format == fmt


@pytest.mark.parametrize("case", CASES)
def test_empty_frame(case):
    for width in (3, 4):
        body, content_type = _encode(np.zeros((0, width), np.float32), case)
        frame = decode(body, VARIANTS.get(case, (case.split("_")[0],))[0], content_type)
        assert frame.points.shape[0] == 0 and frame.points.shape[1] >= 3


def test_organised_pcd_keeps_every_point_and_nan():
    points = np.array(_frame(NAMES[-1])[: 64 * 1000])
    points[::7, :3] = np.nan  # invalid returns of an organised scan
    for data in ("binary", "ascii", "binary_compressed"):
        body, _ = encode(points, "pcd", data=data, width=1000, height=64)
        assert b"WIDTH 1000\nHEIGHT 64\n" in body
        np.testing.assert_array_equal(decode(body).points, points)


@pytest.mark.parametrize("fmt", ["pcd", "ply", "pointcloud2"])
def test_scalar_types(fmt):
    points = _frame(NUSC)[:, :4]  # integer intensities 0..255
    dtypes = {"x": "f8", "y": "f8", "z": "f4", "intensity": "u1"}
    body, _ = encode(points, fmt, dtypes=dtypes)
    np.testing.assert_array_equal(decode(body).points, points)
    for t in ("i2", "u2", "i4", "u4", "f8", "i1"):
        ints = np.round(np.clip(points, -100, 100)).astype(np.float32)
        ints[:, :3] = np.abs(ints[:, :3]) if t[0] == "u" else ints[:, :3]
        body, _ = encode(ints, fmt, dtypes=dict.fromkeys("xyz", t))
        np.testing.assert_array_equal(decode(body).points, ints)


@pytest.mark.parametrize("fmt", ["pcd", "ply", "pointcloud2"])
@pytest.mark.parametrize("field", ["i", "reflectivity", "Intensity"])
def test_intensity_aliases(fmt, field):
    points = _frame(SMALL)
    body, _ = encode(points, fmt, intensity_name=field)
    np.testing.assert_array_equal(decode(body).points, points)


def test_pcd_count_and_padding_fields():
    n = 50
    rec = np.zeros(
        n,
        dtype=[
            ("x", "<f4"),
            ("pad", "u1", (3,)),
            ("y", "<f8"),
            ("z", "<f4"),
            ("normal", "<f4", (3,)),
            ("intensity", "<u2"),
            ("_", "u1", (2,)),
        ],
    )
    points = _frame(SMALL)
    rec["x"], rec["y"], rec["z"] = points[:, 0], points[:, 1], points[:, 2]
    rec["intensity"] = np.arange(n)
    rec["normal"] = 7
    head = (
        "# .PCD v0.7\nVERSION 0.7\nFIELDS x _ y z normal intensity _\nSIZE 4 1 8 4 4 2 1\n"
        "TYPE F U F F F U U\nCOUNT 1 3 1 1 3 1 2\nWIDTH 10\nHEIGHT 5\n"
        f"VIEWPOINT 0 0 0 1 0 0 0\nPOINTS {n}\nDATA binary\n"
    ).encode()
    frame = decode(head + rec.tobytes())
    np.testing.assert_array_equal(frame.points[:, :3], points[:, :3])
    np.testing.assert_array_equal(frame.points[:, 3], np.arange(n))
    assert frame.sensor == "ouster"  # intensities up to 49 > 1
    # the same cloud as ascii and as binary_compressed (fields stored one after another)
    cols = [rec[k].reshape(n, -1) for k in ("x", "pad", "y", "z", "normal", "intensity", "_")]
    text = "\n".join(
        " ".join(repr(float(v)) if c.dtype.kind == "f" else str(v) for c in cols for v in c[i])
        for i in range(n)
    )
    frame = decode(head.replace(b"DATA binary", b"DATA ascii") + text.encode())
    np.testing.assert_array_equal(frame.points[:, :3], points[:, :3])
    raw = b"".join(np.ascontiguousarray(c).tobytes() for c in cols)
    comp = lzf.compress(raw, matches=True)
    body = head.replace(b"binary", b"binary_compressed") + struct.pack("<II", len(comp), len(raw))
    np.testing.assert_array_equal(decode(body + comp).points[:, 3], np.arange(n))


def test_lzf_back_references():
    pts = np.repeat(_frame(SMALL), 20, axis=0)  # repeats: many back references
    for data in (pts.tobytes(), b"abcabcabcabcabcabcabcabcabcabc" * 40, bytes(3000), b"", b"x"):
        comp = lzf.compress(data, matches=True)
        assert lzf.decompress(comp, len(data)) == data
        assert lzf.decompress(lzf.compress(data), len(data)) == data
    assert len(lzf.compress(pts.tobytes(), matches=True)) < pts.nbytes // 5
    # a hand-made stream: literal "ab", then 7 bytes from 2 back (overlapping) -> "ababababa"
    assert lzf.decompress(bytes([1]) + b"ab" + bytes([(5 << 5) | 0, 1]), 9) == b"ababababa"
    for bad, size in ((bytes([5]) + b"ab", 6), (bytes([0x20, 5]), 3), (bytes([1]) + b"ab", 3)):
        with pytest.raises(lzf.LZFError):
            lzf.decompress(bad, size)


def test_open3d_interop(tmp_path):
    o3d = pytest.importorskip("open3d")
    points = _frame(NAMES[0])
    cloud = o3d.t.geometry.PointCloud(o3d.core.Tensor(np.ascontiguousarray(points[:, :3])))
    cloud.point["intensity"] = o3d.core.Tensor(np.ascontiguousarray(points[:, 3:4]))
    for ext, kw in (("pcd", {"compressed": True}), ("pcd", {}), ("ply", {})):
        path = tmp_path / f"o3d.{ext}"
        o3d.t.io.write_point_cloud(str(path), cloud, write_ascii=False, **kw)
        np.testing.assert_array_equal(decode(path.read_bytes()).points, points)
    for data in ("binary_compressed", "binary", "ascii"):  # Open3D reads what we write
        path = tmp_path / f"ours_{data}.pcd"
        path.write_bytes(encode(points[:2000], "pcd", data=data, lzf_matches=True)[0])
        back = o3d.t.io.read_point_cloud(str(path))
        np.testing.assert_array_equal(back.point.positions.numpy(), points[:2000, :3])


def test_ply_skips_other_elements():
    points = _frame(SMALL)
    n = len(points)
    for encoding, order in (("binary_little_endian", "<"), ("binary_big_endian", ">")):
        head = (
            f"ply\nformat {encoding} 1.0\ncomment end_header in a comment\n"
            "element camera 2\nproperty float a\nproperty list uchar int ids\n"
            f"element vertex {n}\nproperty double z\nproperty float x\nproperty uchar flag\n"
            "property float y\nproperty float intensity\n"
            "element face 1\nproperty list uchar int vertex_indices\nend_header\n"
        ).encode()
        cams = struct.pack(order + "fB2i", 1.0, 2, 5, 6) + struct.pack(order + "fB", 2.0, 0)
        rec = np.zeros(
            n,
            dtype=[
                ("z", order + "f8"),
                ("x", order + "f4"),
                ("flag", "u1"),
                ("y", order + "f4"),
                ("intensity", order + "f4"),
            ],
        )
        for j, k in enumerate("xyz"):
            rec[k] = points[:, j]
        rec["intensity"] = points[:, 3]
        face = struct.pack(order + "B3i", 3, 0, 1, 2)
        np.testing.assert_array_equal(decode(head + cams + rec.tobytes() + face).points, points)
    text = "\n".join(f"{z!r} {x!r} 1 {y!r} {i!r}" for x, y, z, i in points.tolist())
    head = head.replace(b"binary_big_endian", b"ascii")
    body = head + b"1.5 2 5 6\n2.5 0\n" + text.encode() + b"\n3 0 1 2\n"
    np.testing.assert_array_equal(decode(body).points, points)
    empty_el = b"element nothing 4000000000\nelement vertex"  # no properties: nothing to skip
    for b in (body, head.replace(b"ascii", b"binary_big_endian") + cams + rec.tobytes()):
        b = b.replace(b"element vertex", empty_el, 1)
        np.testing.assert_array_equal(decode(b).points, points)


# ---- PointCloud2 against an independent CDR implementation ------------------------------------


def test_pointcloud2_matches_rosbags():
    typesys = pytest.importorskip("rosbags.typesys")
    store = typesys.get_typestore(typesys.Stores.ROS2_HUMBLE)
    msgtype = "sensor_msgs/msg/PointCloud2"
    points = _frame(SMALL)
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


# ---- format inference --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        "pcd_ascii",
        "pcd_binary",
        "pcd_binary_compressed",
        "ply_ascii",
        "ply_binary_big_endian",
        "npy",
        "npy_float64",
        "las",
        "pointcloud2",
        "pointcloud2_big_endian",
        "json",
        "json_bare",
    ],
)
def test_infer_from_magic(case):
    body, _ = _encode(_frame(SMALL), case)
    fmt = VARIANTS.get(case, (case.split("_")[0],))[0]
    assert infer_format(body, None) == fmt
    assert infer_format(body, "application/octet-stream") == fmt
    if fmt in ("pcd", "ply", "npy", "las"):  # unmistakable magic beats a wrong content type
        assert infer_format(body, "application/x-www-form-urlencoded") == fmt
        assert infer_format(body, "application/json") == fmt


def test_infer_from_content_type_and_fallback():
    assert infer_format(b"\0" * 16, "application/x-nuscenes") == "nuscenes"
    assert infer_format(b"\0" * 12, "application/x-xyz; charset=binary") == "xyz"
    assert infer_format(b"{}", "Application/JSON; charset=utf-8") == "json"
    assert infer_format(b"", "application/vnd.api+json") == "json"
    assert infer_format(b"\0" * 64, None) == "kitti"  # zeros: not a parseable PointCloud2
    assert infer_format(b"\0\x01\0\0" + b"\0" * 60, None) == "kitti"
    assert infer_format(b"VERSION 0.7\nFIELDS x y z\n", None) == "pcd"
    assert infer_format(b"FIELDS x y z\n", None) == "pcd"
    assert infer_format(b"ply\r\nformat ascii 1.0\r\n", None) == "ply"
    kitti = np.array(_frame(SMALL)).tobytes()
    assert infer_format(kitti, None) == "kitti" and infer_format(kitti, "text/plain") == "kitti"
    assert decode(kitti).sensor == "kitti"
    assert infer_format(b"[1e999, {", None) == "json"


# ---- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt,size", [("kitti", 16), ("nuscenes", 20), ("xyz", 12)])
def test_not_a_multiple_of_the_point_size(fmt, size):
    for n in (1, size - 1, 3 * size + 2):
        err = _error(b"\0" * n, fmt)
        assert err.status == 400 and err.code == "malformed_body" and str(size) in err.detail


def test_unknown_format():
    err = _error(b"\0" * 16, "laz")
    assert (err.status, err.code) == (415, "unsupported_format") and "pcd" in err.detail


PCD_OK = (
    "VERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\nWIDTH 2\nHEIGHT 1\n"
    "POINTS 2\nDATA ascii\n1 2 3\n4 5 6\n"
)


@pytest.mark.parametrize(
    "old,new",
    [
        ("DATA ascii\n", ""),
        ("SIZE 4 4 4", "SIZE 4 4"),
        ("WIDTH 2", "WIDTH two"),
        ("POINTS 2", "POINTS 3"),
        ("TYPE F F F", "TYPE F F Q"),
        ("SIZE 4 4 4", "SIZE 4 4 3"),
        ("DATA ascii", "DATA zip"),
        ("FIELDS x y z\n", ""),
        ("COUNT 1 1 1", "COUNT 1 0 1"),
        ("WIDTH 2", "WIDTH -2"),
        ("VERSION 0.7", "VERSION 0.7\nCOLOR red"),
        ("TYPE F F F\n", ""),
        ("4 5 6", "4 5"),
        ("4 5 6", "4 5 six"),
        ("4 5 6", "4 5 6 7"),
        ("WIDTH 2\n", ""),
        ("VERSION 0.7", "VERSION \xe9"),
    ],
)
def test_broken_pcd(old, new):
    body = PCD_OK.replace(old, new).encode("latin-1")
    assert decode(PCD_OK.encode(), "pcd").points.shape == (2, 3)
    err = _error(body, "pcd")
    assert err.status == 400, err.detail


def test_pcd_without_xyz_is_unusable():
    err = _error(PCD_OK.replace("FIELDS x y z", "FIELDS a b c").encode(), "pcd")
    assert err.status == 422 and "x/y/z" in err.detail


def test_truncated_binary_pcd_and_ply():
    points = _frame(SMALL)
    for case in (
        "pcd_binary",
        "pcd_binary_compressed",
        "ply_binary_little_endian",
        "ply_binary_big_endian",
        "ply_ascii",
    ):
        body, _ = encode(points, case)
        for cut in (1, 17, len(body) // 3) if "ascii" not in case else (len(body) // 3,):
            assert _error(body[:-cut]).status == 400, (case, cut)
    body, _ = encode(points, "pcd_binary")
    assert _error(body + b"\0").status == 400  # trailing bytes
    body, _ = encode(points, "pcd_binary_compressed", lzf_matches=True)
    head, data = body.split(b"DATA binary_compressed\n")
    head += b"DATA binary_compressed\n"
    csize, usize = struct.unpack_from("<II", data)
    corrupt = bytearray(data)
    corrupt[8] = 0xFF  # a back reference before the start of the output
    for bad in (
        head + bytes(corrupt),
        head + data[:5],
        head + struct.pack("<II", csize, usize + 4) + data[8:],
        head + struct.pack("<II", csize + 9, usize) + data[8:],
    ):
        assert _error(bad).status == 400


@pytest.mark.parametrize(
    "body",
    [
        b"ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\n",  # no end_header
        b"ply\nformat zip 1.0\nelement vertex 0\nproperty float x\nend_header\n",
        b"ply\nelement vertex 0\nproperty float x\nend_header\n",  # no format
        b"ply\nformat ascii 1.0\nelement vertex 1\nproperty quad x\nend_header\n1\n",
        b"ply\nformat ascii 1.0\nelement vertex x\nproperty float x\nend_header\n",
        b"ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nproperty float y\n"
        b"property float z\nend_header\n1 2 zz\n",
    ],
)
def test_broken_ply(body):
    assert _error(body, "ply").status == 400


def test_ply_without_vertices_or_xyz_is_unusable():
    assert _error(b"ply\nformat ascii 1.0\nelement face 0\nend_header\n").status == 422
    assert (
        _error(b"ply\nformat ascii 1.0\nelement vertex 0\nproperty float x\nend_header\n").status
        == 422
    )


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
    points = _frame(SMALL)
    body, _ = encode(points, "pointcloud2", height=5)  # width 10, point_step 16, row_step 160
    assert decode(_pc2_patch(body)).points.shape == (50, 4)
    err = _error(_pc2_patch(body, **patch), "pointcloud2")
    assert err.status == 400, err.detail


def test_broken_pointcloud2():
    body, _ = encode(_frame(SMALL), "pointcloud2")
    assert _error(body[:-3], "pointcloud2").status == 400  # truncated: no is_dense
    assert _error(body[:40], "pointcloud2").status == 400
    assert _error(b"\x01\x00" + body[2:], "pointcloud2").status == 400  # not plain CDR
    at = body.index(b"\x0c\x00\x00\x00\x07", body.index(b"intensity\x00")) + 4
    bad_type = body[:at] + b"\x09" + body[at + 1 :]  # intensity: datatype 9 (no such type)
    assert _error(bad_type, "pointcloud2").status == 400
    no_x = body.replace(b"\x02\x00\x00\x00x\x00", b"\x02\x00\x00\x00q\x00")
    assert _error(no_x, "pointcloud2").status == 422


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
        err = _error(npy(arr), "npy")
        assert err.status == 422 and "dtype" in err.detail
    for arr in (np.ones(12, np.float32), np.ones((5, 2), np.float32), np.ones((2, 3, 4))):
        err = _error(npy(arr))
        assert err.status == 422 and "shape" in err.detail
    good = npy(np.ones((5, 4), np.float32))
    assert _error(good[:-1]).status == 400 and _error(good + b"\0").status == 400
    assert _error(good[:30]).status == 400  # header cut
    assert _error(good.replace(b"'descr'", b"'dscr' "), "npy").status == 400
    assert _error(b"PK\x03\x04", "npy").status == 400  # an .npz is not an .npy


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
        assert _error(body, "json").status == 400, body
    for body in (
        b"[[1, 2], [3, 4]]",
        b"[[1, 2, 3], [1, 2]]",
        b"[1, 2, 3]",
        b'{"pts": []}',
        b'"points"',
        b'{"points": {"x": 1}}',
        b"[[1, 2, 3], 4]",
    ):
        assert _error(body, "json").status == 422, body
    assert decode(b'{"points": []}').points.shape == (0, 3)
    frame = decode(b'{"points": [[1, 2, 3, 200, 7]]}')
    assert frame.points.shape == (1, 5) and frame.sensor == "ouster"


def test_las_errors():
    pytest.importorskip("laspy")
    body, _ = encode(_frame(SMALL), "las")
    assert _error(body[:-40], "las").status == 400
    assert _error(body[:200], "las").status == 400
    assert _error(b"LASF" + b"\0" * 50).status == 400
    for offset, value in ((100, 0xFFFFFFFF), (107, 0xFFFFFFF), (96, 1 << 30)):
        bad = bytearray(body)  # corrupt VLR count, point count, point data offset
        struct.pack_into("<I", bad, offset, value)
        assert _error(bytes(bad), "las").status == 400
    laz = bytearray(body)
    laz[104] |= 0x80  # point format id bit 7: LAZ-compressed
    err = _error(bytes(laz), "las")
    assert err.status in (400, 415), err.detail


def test_max_points():
    points = _frame(SMALL)
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
        err = _error(body, None, content_type, max_points=49)
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
    body, content_type = encode(_frame(SMALL), case)
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
