"""Wire codecs (app/codecs): round trips of the real frames through every format and variant,
scalar types and intensity aliases, and format inference from the content type and magic bytes."""

from __future__ import annotations

import numpy as np
import pytest

from app.codecs import binary, decode, infer_format
from app.codecs.encode import VARIANTS, encode
from tests.app.codec_cases import NAMES, SMALL, real_frame
from tests.conftest import frame_id

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
    *binary.LAYOUTS,
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


def _expected(points: np.ndarray, case: str) -> np.ndarray:
    fmt = VARIANTS.get(case, (case.split("_")[0],))[0]
    if fmt in binary.LAYOUTS:
        width = binary.LAYOUTS[fmt][0]
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


# ---- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", NAMES, ids=frame_id)
def test_round_trip(name, case):
    points = real_frame(name)
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
    if fmt in ("kitti", "ouster", "nuscenes"):
        assert frame.sensor == fmt
    elif fmt == "xyz":
        assert frame.sensor == "kitti"
    else:
        assert frame.sensor == RULE_SENSOR[frame_id(name)]
    if fmt not in binary.LAYOUTS:  # self-describing: magic bytes / structure
        assert decode(body).format == fmt


@pytest.mark.parametrize("case", CASES)
def test_empty_frame(case):
    for width in (3, 4):
        body, content_type = _encode(np.zeros((0, width), np.float32), case)
        frame = decode(body, VARIANTS.get(case, (case.split("_")[0],))[0], content_type)
        assert frame.points.shape[0] == 0 and frame.points.shape[1] >= 3


@pytest.mark.parametrize("fmt", ["pcd", "ply", "pointcloud2"])
def test_scalar_types(fmt):
    points = real_frame(NUSC)[:, :4]  # integer intensities 0..255
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
    points = real_frame(SMALL)
    body, _ = encode(points, fmt, intensity_name=field)
    np.testing.assert_array_equal(decode(body).points, points)


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
    body, _ = _encode(real_frame(SMALL), case)
    fmt = VARIANTS.get(case, (case.split("_")[0],))[0]
    assert infer_format(body, None) == fmt
    assert infer_format(body, "application/octet-stream") == fmt
    if fmt in ("pcd", "ply", "npy", "las"):  # unmistakable magic beats a wrong content type
        assert infer_format(body, "application/x-www-form-urlencoded") == fmt
        assert infer_format(body, "application/json") == fmt


def test_infer_from_content_type_and_fallback():
    assert infer_format(b"\0" * 16, "application/x-nuscenes") == "nuscenes"
    assert infer_format(b"\0" * 16, "application/x-ouster") == "ouster"
    assert infer_format(b"\0" * 12, "application/x-xyz; charset=binary") == "xyz"
    assert infer_format(b"{}", "Application/JSON; charset=utf-8") == "json"
    assert infer_format(b"", "application/vnd.api+json") == "json"
    assert infer_format(b"\0" * 64, None) == "kitti"  # zeros: not a parseable PointCloud2
    assert infer_format(b"\0\x01\0\0" + b"\0" * 60, None) == "kitti"
    assert infer_format(b"VERSION 0.7\nFIELDS x y z\n", None) == "pcd"
    assert infer_format(b"FIELDS x y z\n", None) == "pcd"
    assert infer_format(b"ply\r\nformat ascii 1.0\r\n", None) == "ply"
    kitti = np.array(real_frame(SMALL)).tobytes()
    assert infer_format(kitti, None) == "kitti" and infer_format(kitti, "text/plain") == "kitti"
    assert decode(kitti).sensor == "kitti"
    assert infer_format(b"[1e999, {", None) == "json"
