"""PCD and PLY codecs: field layouts, organised scans, LZF, Open3D interop, other PLY elements,
and every malformed, truncated or unusable PCD and PLY body answering the right 4xx status."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from app.codecs import decode, lzf
from app.codecs.encode import encode
from tests.app.codec_cases import NAMES, SMALL, decode_error, real_frame


# ---- layouts, compression, interop -------------------------------------------------------------


def test_organised_pcd_keeps_every_point_and_nan():
    points = np.array(real_frame(NAMES[-1])[: 64 * 1000])
    points[::7, :3] = np.nan  # invalid returns of an organised scan
    for data in ("binary", "ascii", "binary_compressed"):
        body, _ = encode(points, "pcd", data=data, width=1000, height=64)
        assert b"WIDTH 1000\nHEIGHT 64\n" in body
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
    points = real_frame(SMALL)
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
    pts = np.repeat(real_frame(SMALL), 20, axis=0)  # repeats: many back references
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
    points = real_frame(NAMES[0])
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
    points = real_frame(SMALL)
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


# ---- errors ------------------------------------------------------------------------------------


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
    err = decode_error(body, "pcd")
    assert err.status == 400, err.detail


def test_pcd_without_xyz_is_unusable():
    err = decode_error(PCD_OK.replace("FIELDS x y z", "FIELDS a b c").encode(), "pcd")
    assert err.status == 422 and "x/y/z" in err.detail


def test_truncated_binary_pcd_and_ply():
    points = real_frame(SMALL)
    for case in (
        "pcd_binary",
        "pcd_binary_compressed",
        "ply_binary_little_endian",
        "ply_binary_big_endian",
        "ply_ascii",
    ):
        body, _ = encode(points, case)
        for cut in (1, 17, len(body) // 3) if "ascii" not in case else (len(body) // 3,):
            assert decode_error(body[:-cut]).status == 400, (case, cut)
    body, _ = encode(points, "pcd_binary")
    assert decode_error(body + b"\0").status == 400  # trailing bytes
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
        assert decode_error(bad).status == 400


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
    assert decode_error(body, "ply").status == 400


def test_ply_without_vertices_or_xyz_is_unusable():
    assert decode_error(b"ply\nformat ascii 1.0\nelement face 0\nend_header\n").status == 422
    assert (
        decode_error(
            b"ply\nformat ascii 1.0\nelement vertex 0\nproperty float x\nend_header\n"
        ).status
        == 422
    )
