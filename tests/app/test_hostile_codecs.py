"""Every known decoder amplifier gets its 4xx with bounded memory.

Each body is decoded in a fresh subprocess, whose peak RSS (resource.getrusage's ru_maxrss, a
high-water mark) is read before and after the decode: the extra peak must stay within a small
multiple of the body plus the point limit's frame (issue 15: a 100 KB PCD once took +1.17 GB, a
171-byte one 4.2 GB).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np
import pytest

from app.codecs.encode import encode
from tests.conftest import REPO_ROOT

MAX_POINTS = 100_000
FRAME_BYTES = MAX_POINTS * 4 * 4  # the limit's frame: float32 x, y, z, intensity
SLACK = 48 * 1024 * 1024  # interpreter, numpy temporaries, allocator rounding

_PROBE = r"""
import json, resource, sys
from app.codecs import DecodeError, decode
body = open(sys.argv[1], "rb").read()
fmt = sys.argv[2] or None
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    frame = decode(body, fmt, None, max_points=int(sys.argv[3]))
    status, n = 200, len(frame.points)
except DecodeError as e:
    status, n = e.status, 0
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"status": status, "points": n, "extra": (after - before) * 1024}))
"""


def _probe(tmp_path, body: bytes, fmt: str | None, max_points: int = MAX_POINTS) -> dict:
    path = tmp_path / "body"
    path.write_bytes(body)
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(path), fmt or "", str(max_points)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _pcd_head(
    fields: str, n: int, data: str, size: str = "4 4 4", typ: str = "F F F", count: str = "1 1 1"
) -> bytes:
    return (
        f"VERSION 0.7\nFIELDS {fields}\nSIZE {size}\nTYPE {typ}\nCOUNT {count}\n"
        f"WIDTH {n}\nHEIGHT 1\nPOINTS {n}\nDATA {data}\n"
    ).encode()


def _amplifiers() -> dict[str, tuple[bytes, str, set[int]]]:
    """name -> (body, format, acceptable statuses)."""
    # many short tokens and one long one: an array as wide as the longest token for every token
    # once took 10,000 x 3 x 40 KB = 1.2 GB for a 100 KB body
    rows = b"1 2 3\n" * 9_999 + b"7 8 " + b"1" * 40_000 + b"\n"
    ply_ascii = (
        b"ply\nformat ascii 1.0\nelement vertex 10000\nproperty float x\n"
        b"property float y\nproperty float z\nend_header\n"
    )
    cases = {
        "pcd_ascii_long_token": (_pcd_head("x y z", 10_000, "ascii") + rows, "pcd", {200}),
        "pcd_ascii_long_junk": (
            _pcd_head("x y z", 10_000, "ascii") + rows.replace(b"1" * 40_000, b"x" * 40_000),
            "pcd",
            {400},
        ),
        "ply_ascii_long_token": (ply_ascii + rows, "ply", {200}),
        # declared sizes far beyond the body or the limit
        "pcd_compressed_1.4gb": (
            _pcd_head("x y z", 1, "binary_compressed", count="1 1 357913941")
            + struct.pack("<II", 4, 4 * (2 + 357913941))
            + b"\0" * 4,
            "pcd",
            {400, 413},
        ),
        "pcd_points_over_limit": (_pcd_head("x y z", 10**9, "binary"), "pcd", {413}),
        "ply_vertex_over_limit": (
            b"ply\nformat binary_little_endian 1.0\nelement vertex "
            b"4000000000\nproperty float x\nproperty float y\n"
            b"property float z\nend_header\n",
            "ply",
            {413},
        ),
        "npy_shape_over_limit": (
            b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': "
            b"False, 'shape': (4000000000, 4), }".ljust(128, b" ")[:127]
            + b"\n",
            "npy",
            {413},
        ),
        # once parsed into Python lists before the count was checked (+1.1 GB for 64 MB)
        "json_rows_over_limit": (b"[" + b"[1,1,1]," * 2_000_000 + b"[1,1,1]]", "json", {413}),
        # a per-item Python loop over list items before the vertices (once 34 s for 8 MiB)
        "ply_lists_before_vertex": (
            b"ply\nformat binary_little_endian 1.0\nelement face "
            b"8000000\nproperty list uchar int ids\nelement vertex 1\n"
            b"property float x\nproperty float y\nproperty float z\n"
            b"end_header\n" + b"\0" * 8_000_000,
            "ply",
            {422},
        ),
    }
    # a valid LZF stream that expands about 88:1 past the point limit: refused before inflating
    n = MAX_POINTS * 4
    run = bytes([0]) + b"\0" + bytes([(7 << 5), 255, 0]) * ((n * 12) // 264 + 1)
    cases["pcd_lzf_88_to_1"] = (
        _pcd_head("x y z", n, "binary_compressed") + struct.pack("<II", len(run), n * 12) + run,
        "pcd",
        {413},
    )
    # a PointCloud2 declaring a huge cloud in a few bytes
    body, _ = encode(np.zeros((4, 4), np.float32), "pointcloud2")
    bad = bytearray(body)
    height_at = 4 + 4 + 4 + 4 + len("lidar") + 1 + 2  # sec, nanosec, frame_id len + text, pad
    struct.pack_into("<II", bad, height_at, 65536, 65536)
    cases["pointcloud2_huge_cloud"] = (bytes(bad), "pointcloud2", {400, 413})
    return cases


@pytest.mark.parametrize("name", sorted(_amplifiers()))
def test_amplifier_gets_4xx_or_result_with_bounded_memory(tmp_path, name):
    body, fmt, statuses = _amplifiers()[name]
    got = _probe(tmp_path, body, fmt)
    assert got["status"] in statuses, (name, got)
    assert got["extra"] <= 4 * len(body) + FRAME_BYTES + SLACK, (name, got, len(body))


def test_large_frame_within_the_limit_costs_about_its_size(tmp_path):
    """The bound is not trivially loose: a frame at the limit decodes, and its ascii form takes
    about what its points and text take, not a multiple of the longest token."""
    points = np.random.default_rng(0).uniform(-50, 50, (MAX_POINTS, 4)).astype(np.float32)
    body, _ = encode(points, "pcd_ascii")
    got = _probe(tmp_path, body, "pcd")
    assert got == {**got, "status": 200, "points": MAX_POINTS}
    assert got["extra"] <= 4 * len(body) + FRAME_BYTES + SLACK, got
