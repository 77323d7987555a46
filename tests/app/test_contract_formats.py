"""Every wire format of every real frame through the in-process app: the body posted without
?format= (inferred from Content-Type and magic bytes) gets the labels the in-process pipeline
gives the same decoded points."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from app.codecs import decode
from app.codecs.encode import encode
from app.inference.builder import build_pipeline
from tests.app.contract_helpers import serving
from tests.conftest import FRAMES, load_frame, require_real_data


@pytest.fixture(scope="module")
def http():
    require_real_data()
    with serving() as client:
        yield client


@pytest.fixture(scope="module")
def pipeline():
    return build_pipeline("random", "cpu", 0.25)


# ---- every wire format, every real frame ---------------------------------------------------

BINARY_VARIANTS = [
    "pcd_binary",
    "pcd_binary_compressed",
    "ply_binary_little_endian",
    "ply_binary_big_endian",
    "npy",
    "npy_float64",
    "las",
    "pointcloud2",
    "pointcloud2_big_endian",
]
TEXT_VARIANTS = ["pcd_ascii", "ply_ascii", "json"]  # several times larger: the small frames


def _wire_cases():
    for name, _ in FRAMES:
        small = "nuscenes" in name or "subset50" in name
        for variant in BINARY_VARIANTS + (TEXT_VARIANTS if small else []):
            yield pytest.param(name, variant, id=f"{name.split('/')[-1][:18]}-{variant}")


_EXPECTED: dict[bytes, np.ndarray] = {}


@pytest.mark.parametrize("name,variant", list(_wire_cases()))
def test_every_format_round_trips_real_frames(http, pipeline, name, variant):
    points = np.array(load_frame(name))[:, :4]
    body, content_type = encode(points, variant)
    # What the server should compute: the same decoding, then the in-process pipeline
    # (memoised on the decoded points: most variants decode to the same floats).
    frame = decode(body, None, content_type)
    assert len(frame.points) == len(points)
    key = hashlib.sha1(
        np.ascontiguousarray(frame.points).tobytes() + frame.sensor.encode()
    ).digest()
    if key not in _EXPECTED:
        _EXPECTED[key] = pipeline.segment(frame.points, frame.sensor).labels
    # Without ?format= the server infers it from the content type and magic bytes.
    r = http.post(
        "/v1/segment",
        content=body,
        headers={"Content-Type": content_type, "Accept": "application/octet-stream"},
    )
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(np.frombuffer(r.content, np.uint8), _EXPECTED[key])
