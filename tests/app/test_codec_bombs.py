"""Decoder bombs whose cost grew with a count the body declares: each is refused (4xx) from its
header, before any per-item Python work, and an input just within each limit still decodes.

PLY: lists before the vertex element are read one Python step each (10 M steps, 15 s, for a
10 MB body once). PointCloud2: every declared field became Python objects (2.7 M fields, 21 s
and +800 MB for a 62 MB body once, twice over when the format was sniffed).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from app.codecs import decode, infer_format, ply, pointcloud2
from app.codecs.encode import encode
from tests.app.codec_cases import decode_error
from tests.app.contract_helpers import BIN, assert_error, serving

POINTS = np.array([[1.5, -2.0, 3.25, 0.5], [4.0, 5.5, -6.0, 0.75]], np.float32)
VERTICES = (
    "element vertex 2\nproperty float x\nproperty float y\nproperty float z\n"
    "property float intensity\nend_header\n"
)


# ---- PLY: lists before the vertex element ------------------------------------------------------


def _ply_lists_bomb() -> bytes:
    """One element of 4,096 items (the former per-element cap) of 2,450 list properties: a
    header under 64 KiB, 10 M lists of length 0."""
    head = (
        b"ply\nformat binary_little_endian 1.0\nelement f 4096\n"
        + b"property list char char a\n" * 2450
        + b"element vertex 1\nproperty float x\nproperty float y\nproperty float z\nend_header\n"
    )
    return head + b"\0" * (4096 * 2450) + b"\0" * 12


def _ply_many_elements_bomb() -> bytes:
    """1,300 elements of 4,096 one-list items each: every element within the former cap, 5.3 M
    lists in all."""
    elements = b"".join(b"element f%d 4096\nproperty list uchar uchar a\n" % j for j in range(1300))
    head = (
        b"ply\nformat binary_little_endian 1.0\n"
        + elements
        + b"element vertex 1\nproperty float x\nproperty float y\nproperty float z\nend_header\n"
    )
    return head + b"\0" * (1300 * 4096) + b"\0" * 12


@pytest.mark.parametrize("bomb", [_ply_lists_bomb, _ply_many_elements_bomb])
def test_ply_lists_over_the_budget_are_refused_before_any_is_read(monkeypatch, bomb):
    skipped = []
    real_skip = ply._skip_binary
    monkeypatch.setattr(ply, "_skip_binary", lambda *a: skipped.append(a[3]) or real_skip(*a))
    body = bomb()
    assert len(body) < 64 * 1024 * 1024 and body.index(b"end_header") < ply.MAX_HEADER
    err = decode_error(body, "ply")
    assert (err.status, err.code) == (422, "unusable_body")
    assert f"at most {ply.MAX_SKIPPED_LISTS}" in err.detail, err.detail
    assert skipped == []  # refused from the header: no element was walked


def _ply_faces_first(order: str, faces: int) -> bytes:
    """A face element of `faces` items (a scalar, a 3-index list, a scalar) before 2 vertices."""
    encoding = {"<": "binary_little_endian", ">": "binary_big_endian"}[order]
    head = (
        f"ply\nformat {encoding} 1.0\nelement face {faces}\nproperty uchar flag\n"
        "property list uchar int vertex_indices\nproperty float area\n" + VERTICES
    ).encode()
    face = struct.pack(order + "BB3if", 1, 3, 0, 1, 2, 0.5)
    return head + face * faces + POINTS.astype(order + "f4").tobytes()


@pytest.mark.parametrize("order", ["<", ">"])
def test_ply_lists_at_the_budget_decode(order):
    body = _ply_faces_first(order, ply.MAX_SKIPPED_LISTS)
    np.testing.assert_array_equal(decode(body, "ply").points, POINTS)
    over = decode_error(_ply_faces_first(order, ply.MAX_SKIPPED_LISTS + 1), "ply")
    assert over.status == 422 and f"{ply.MAX_SKIPPED_LISTS + 1} lists" in over.detail


def test_ply_list_lengths_must_be_integers():
    head = (
        "ply\nformat binary_little_endian 1.0\nelement face 1\n"
        "property list float int vertex_indices\n" + VERTICES
    ).encode()
    err = decode_error(head + struct.pack("<f", 3.0) + POINTS.tobytes(), "ply")
    assert err.status == 400 and "non-integer length type" in err.detail, err.detail


@pytest.mark.parametrize(
    "length_type, length, expected",
    [("char", struct.pack("b", -1), "negative list length"), ("uchar", b"\xc8", "truncated")],
)
def test_ply_bad_lists_before_the_vertices_are_still_400(length_type, length, expected):
    """The list-skipping loop's own refusals (as before it was rewritten)."""
    head = (
        "ply\nformat binary_little_endian 1.0\nelement face 1\n"
        f"property list {length_type} int vertex_indices\n" + VERTICES
    ).encode()
    err = decode_error(head + length + POINTS.tobytes(), "ply")
    assert err.status == 400 and expected in err.detail, err.detail


# ---- PointCloud2: the fields ---------------------------------------------------------------


def _pc2(names: list[str], body_tail: bytes = b"") -> bytes:
    """A little-endian PointCloud2 of POINTS: x, y, z, intensity (float32 at offsets 0-12) then
    one uint8 field at offset 16 for each of `names`."""
    w = pointcloud2._Writer("<")
    w.put("i", 0)
    w.put("I", 0)
    w.string("lidar")
    w.put("I", 1)  # height
    w.put("I", len(POINTS))  # width
    w.put("I", 4 + len(names))
    for j, name in enumerate(["x", "y", "z", "intensity", *names]):
        w.string(name)
        w.put("I", 4 * j if j < 4 else 16)
        w.put("B", 7 if j < 4 else 2)  # FLOAT32, UINT8
        w.put("I", 1)
    data = np.zeros((len(POINTS), 20), np.uint8)
    data[:, :16] = POINTS.view(np.uint8)
    w.put("B", 0)  # is_bigendian
    w.put("I", 20)  # point_step
    w.put("I", data.size)  # row_step
    w.put("I", data.size)
    w.buf.extend(data.tobytes())
    w.put("B", 1)
    return b"\x00\x01\x00\x00" + bytes(w.buf)


def _pc2_fields_bomb(nfields: int = 200_000) -> bytes:
    """A message declaring `nfields` one-byte fields with distinct names (24 bytes each, as CDR
    aligns them), all of which fit in the body: a valid message of 4.8 MB."""
    head = struct.pack("<iII6s2xIII", 0, 0, 6, b"lidar\0", 1, 1, nfields)
    field = struct.Struct("<I8sIB3xI")  # name length, name + NUL, offset, UINT8, count
    fields = b"".join(field.pack(8, b"%07x\0" % j, 0, 2, 1) for j in range(nfields))
    tail = struct.pack("<B3xIIIBB", 0, 1, 1, 1, 0, 1)  # point_step, row_step, 1 data byte
    return b"\x00\x01\x00\x00" + head + fields + tail


def _count_strings(monkeypatch) -> list:
    """The strings parse reads (frame_id, then one name a field), recorded as they are read."""
    read = []
    real_string = pointcloud2._Reader.string
    monkeypatch.setattr(
        pointcloud2._Reader,
        "string",
        lambda self, *a: read.append(self.pos) or real_string(self, *a),
    )
    return read


def test_pointcloud2_fields_over_the_limit_are_refused_before_any_is_read(monkeypatch):
    body = _pc2_fields_bomb()
    read = _count_strings(monkeypatch)
    err = decode_error(body, "pointcloud2")
    assert (err.status, err.code) == (422, "unusable_body")
    assert f"200000 fields (at most {pointcloud2.MAX_FIELDS})" in err.detail, err.detail
    assert len(read) == 1  # the frame_id only: no field name was read


def test_pointcloud2_sniffing_does_not_read_the_fields_either(monkeypatch):
    body = _pc2_fields_bomb()
    read = _count_strings(monkeypatch)
    assert infer_format(body, None) == "pointcloud2"  # one past a limit: its decode says which
    assert len(read) == 1
    err = decode_error(body)
    assert err.status == 422 and f"at most {pointcloud2.MAX_FIELDS}" in err.detail, err.detail


def test_pointcloud2_fields_at_the_limits_decode():
    long_names = [f"f{j}".ljust(pointcloud2.MAX_NAME_BYTES - 1, "_") for j in range(1020)]
    body = _pc2(long_names)  # MAX_FIELDS fields, every extra name MAX_NAME_BYTES with its NUL
    for fmt in ("pointcloud2", None):
        frame = decode(body, fmt)
        assert frame.format == "pointcloud2"
        np.testing.assert_array_equal(frame.points, POINTS)
    over = decode_error(_pc2([*long_names, "one_more"]), "pointcloud2")
    assert over.status == 422 and f"at most {pointcloud2.MAX_FIELDS}" in over.detail
    too_long = decode_error(_pc2(["n" * pointcloud2.MAX_NAME_BYTES]), "pointcloud2")
    assert too_long.status == 422 and "field name" in too_long.detail, too_long.detail


# ---- through the app -----------------------------------------------------------------------


def test_the_app_answers_the_bombs_with_json_and_keeps_serving():
    good, _ = encode(POINTS, "pointcloud2")
    with serving() as http:
        for body, query in (
            (_ply_lists_bomb(), "?format=ply"),
            (_pc2_fields_bomb(), "?format=pointcloud2"),
            (_pc2_fields_bomb(), ""),  # sniffed as PointCloud2, refused for its fields
        ):
            r = http.post(f"/v1/segment{query}", content=body, headers=BIN)
            assert_error(r, 422)
            ok = http.post("/v1/segment?format=pointcloud2", content=good, headers=BIN)
            assert ok.status_code == 200, ok.text
