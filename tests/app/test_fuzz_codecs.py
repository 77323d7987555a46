"""Property-based fuzzing of every decoder (hypothesis): mutated valid frames, truncations,
insertions and header numbers edited to huge, zero or negative values. Every body either decodes
to a valid frame within the point limit or raises a 4xx DecodeError, and the decode's peak
traced memory (tracemalloc, which numpy reports its buffers to) stays within a small multiple of
the body plus the limit's frame. Bounded in time: a fixed number of examples per format.
"""

from __future__ import annotations

import re
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.codecs import DecodeError, decode
from app.codecs.encode import VARIANTS, encode

MAX_POINTS = 5_000
FRAME_BYTES = MAX_POINTS * 8 * 8  # generous: up to 8 float64 columns
CASES = [
    "kitti",
    "ouster",
    "nuscenes",
    "xyz",
    "pcd_ascii",
    "pcd_binary",
    "pcd_binary_compressed",
    "ply_ascii",
    "ply_binary_little_endian",
    "ply_binary_big_endian",
    "npy",
    "npy_float64",
    "las",
    "pointcloud2",
    "pointcloud2_big_endian",
    "json",
]
_NUMBER = re.compile(rb"\d+")


def _valid(case: str) -> tuple[bytes, str]:
    rng = np.random.default_rng(len(case))
    points = rng.uniform(-30, 30, (64, 4)).astype(np.float32)
    points[:, 3] = rng.uniform(0, 1, 64)
    if case == "las":
        pytest.importorskip("laspy")
    body, _ = encode(points, case)
    return body, VARIANTS.get(case, (case,))[0]


@st.composite
def mutated(draw, body: bytes) -> bytes:
    b = bytearray(body)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "number", "delete"]))
        if not b:
            break
        pos = draw(st.integers(0, len(b) - 1))
        if kind == "flip":
            b[pos] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del b[pos:]
        elif kind == "delete":
            del b[pos : pos + draw(st.integers(1, 16))]
        elif kind == "insert":
            b[pos:pos] = draw(st.binary(min_size=1, max_size=24))
        else:  # a header number made huge, zero or negative
            numbers = list(_NUMBER.finditer(bytes(b[:400])))
            if numbers:
                m = draw(st.sampled_from(numbers))
                new = draw(
                    st.sampled_from(
                        [
                            b"0",
                            b"-1",
                            b"4294967295",
                            b"99999999999999",
                            b"18446744073709551615",
                            b"65536",
                        ]
                    )
                )
                b[m.start() : m.end()] = new
    return bytes(b)


def _decode_bounded(body: bytes, fmt: str | None) -> None:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        try:
            frame = decode(body, fmt, None, max_points=MAX_POINTS)
        except DecodeError as e:
            assert e.status in (400, 413, 415, 422), e.status
            assert e.detail and e.code
        else:
            pts = frame.points
            assert pts.dtype == np.float32 and pts.ndim == 2 and pts.shape[1] >= 3
            assert len(pts) <= MAX_POINTS
            assert frame.sensor in ("kitti", "nuscenes", "ouster")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 8 * len(body) + FRAME_BYTES + (1 << 20), (peak, len(body))


@pytest.mark.parametrize("case", CASES)
def test_fuzzed_bodies_decode_or_get_4xx_with_bounded_memory(case):
    body, fmt = _valid(case)

    @settings(
        max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    @given(data=mutated(body), infer=st.booleans())
    def check(data, infer):
        _decode_bounded(data, None if infer else fmt)

    check()


@settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(
    st.binary(max_size=600),
    st.sampled_from([None, "pcd", "ply", "npy", "las", "json", "pointcloud2", "kitti"]),
)
def test_random_bytes_in_any_format(body, fmt):
    _decode_bounded(body, fmt)


@settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=4)),
        lambda inner: (
            st.lists(inner, max_size=5)
            | st.dictionaries(st.sampled_from(["points", "x", "meta"]), inner, max_size=3)
        ),
        max_leaves=30,
    )
)
def test_json_documents(doc):
    import json

    _decode_bounded(json.dumps(doc).encode(), "json")
