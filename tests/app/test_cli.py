"""The command line, run as users run it (a subprocess), on a real frame."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.codecs.files import posting_format
from tests.conftest import REPO_ROOT, require_real_data

NUSCENES = "nuscenes/n015-2018-07-24-11-22-45+0800__LIDAR_TOP__1532402927647951.pcd.bin"


def app_process(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def run_app(*args: str) -> str:
    proc = app_process(*args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_segment_prints_counts_and_timing():
    frame = require_real_data() / NUSCENES
    out = run_app("segment", str(frame), "--weights", "random", "--cr", "0.25")
    assert "34688 points" in out
    timing = json.loads(out.split("timing_ms ", 1)[1].splitlines()[0])
    assert set(timing) == {"voxelize", "maps", "network", "devoxelize"}
    counts = [int(line.split()[-1]) for line in out.splitlines() if line.startswith("  ")]
    assert sum(counts) == 34688


def test_crosscheck_prints_one_json_line():
    pytest.importorskip("spconv.pytorch")
    frame = require_real_data() / NUSCENES
    lines = (
        run_app("crosscheck", str(frame), "--weights", "random", "--cr", "0.25")
        .strip()
        .splitlines()
    )
    report = json.loads(lines[-1])
    assert report["num_points"] == 34688 and report["num_voxels"] > 20000
    assert report["label_agreement"] >= 0.9999
    assert report["max_rel_logit_error"] < 1e-3
    assert {"ours", "spconv"} <= set(report["timing_ms"])


def test_user_errors_are_one_line_each(tmp_path):
    """A wrong file, format or value: one line on stderr and exit status 1 (argparse's: 2),
    never a traceback; before, each of these but the first ended in one."""
    (tmp_path / "broken.bin").write_bytes(b"\x00" * 10)
    (tmp_path / "empty.bin").write_bytes(b"")
    (tmp_path / "mystery.dat").write_bytes(b"\x01\x02" * 8)
    cases = [
        (["segment", str(tmp_path / "broken.bin")], 1, "not a multiple of the point size"),
        (["segment", str(tmp_path / "missing.bin")], 1, "No such file"),
        (["segment", str(tmp_path)], 1, "Is a directory"),
        (["segment", str(tmp_path / "empty.bin")], 1, "no points"),
        (["segment", str(tmp_path / "mystery.dat")], 1, "give one with --format"),
        (["segment", str(tmp_path / "broken.bin"), "--format", "foo"], 1, "unknown format"),
        (["evaluate", str(tmp_path / "broken.bin"), "x.label", "--device", "foo"], 2, "--device"),
        (["client", str(tmp_path / "broken.bin"), "--repeat", "0"], 2, "at least 1"),
    ]
    for args, status, says in cases:
        proc = app_process(*args)
        assert proc.returncode == status and says in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)


def test_frame_files_of_any_wire_format_are_read_by_their_bytes(tmp_path):
    """A PLY, PCD or LAS file without a known name was read as KITTI floats (made-up classes,
    exit 0); the command line reads it as the service does, by its bytes."""
    import numpy as np

    from app.codecs.encode import encode
    from app.codecs.files import read_frame

    points = np.random.default_rng(0).uniform(-20, 20, (500, 4)).astype(np.float32)
    points[:, 3] = 0.5
    for fmt in ("ply", "pcd", "las"):
        body, _ = encode(points, fmt)
        path = tmp_path / f"frame.{fmt}"
        path.write_bytes(body)
        read, sensor = read_frame(path)
        np.testing.assert_allclose(read[:, :3], points[:, :3], atol=0.01)
        assert read.flags.writeable and sensor in ("kitti", "ouster")  # LAS: 16-bit intensity
    points[:, 3] = np.linspace(0, 255, len(points))  # an Ouster's reflectivity, saved as .npy
    np.save(tmp_path / "scan.npy", points)
    read, sensor = read_frame(tmp_path / "scan.npy")  # was KITTI's 0..1 whatever the values
    np.testing.assert_array_equal(read, points)
    assert sensor == "ouster" and read.flags.writeable
    assert read_frame(tmp_path / "scan.npy", sensor="nuscenes")[1] == "nuscenes"  # --sensor


@pytest.mark.parametrize(
    "name,given,posted",
    [
        ("000000.bin", None, "kitti"),
        ("n015__LIDAR_TOP__1.pcd.bin", None, "nuscenes"),
        ("os1-128_scan0_xyzr.bin", None, "ouster"),  # intensity 0..255: not clamped to 0..1
        ("scan.pcd", None, None),  # self-describing: the service infers it
        ("os1-128_scan0_xyzr.bin", "kitti", "kitti"),
    ],
)
def test_the_client_command_posts_a_file_in_its_raw_layout(name, given, posted):
    assert posting_format(Path("/frames") / name, given) == posted


def test_the_client_refuses_an_answer_that_is_not_the_services():
    """A 200 from something else (labels not one per point, JSON without our fields) is an
    error, not a report of made-up labels with exit status 0."""
    from types import SimpleNamespace

    import httpx

    from app.client import percentiles, report_answer

    binary = SimpleNamespace(binary=True, frame="f")
    with pytest.raises(ValueError, match="X-Num-Points"):
        report_answer(binary, httpx.Response(200, content=b"x" * 18))
    with pytest.raises(ValueError, match="X-Num-Points"):
        report_answer(binary, httpx.Response(200, content=b"x" * 18, headers={"x-num-points": "5"}))
    report_answer(binary, httpx.Response(200, content=b"x" * 5, headers={"x-num-points": "5"}))
    as_json = SimpleNamespace(binary=False, frame="f")
    with pytest.raises(ValueError):
        report_answer(as_json, httpx.Response(200, content=b"<html>"))
    with pytest.raises(KeyError):
        report_answer(as_json, httpx.Response(200, json={"ok": True}))
    assert percentiles([]) == {"p50": None, "p95": None, "p99": None}  # JSON has no NaN


def test_crosscheck_feeds_both_networks_the_cleaned_frame():
    """The pipeline cleans a frame's values (intensities of 3e38 clamped); the spconv twin got
    the raw ones and reported a disagreement that was not there (agreement 0.007)."""
    pytest.importorskip("spconv.pytorch")
    import numpy as np
    import torch

    from app.inference.crosscheck import crosscheck
    from app.inference.pipeline import SegmentationPipeline
    from models.minkunet import MinkUNet
    from tests.conftest import load_frame

    torch.manual_seed(0)
    pipeline = SegmentationPipeline(MinkUNet(cr=0.25), precision="fp32")
    points = np.array(load_frame(NUSCENES))[:8000, :4].copy()
    points[::10, 3] = 3e38
    report = crosscheck(pipeline, points, "nuscenes")
    assert report["label_agreement"] >= 0.9999 and report["max_rel_logit_error"] < 1e-3


def test_counts_on_the_command_lines_refuse_what_makes_no_sense():
    """app/argtypes.py: a count below its floor is argparse's one line, not a traceback deep in
    (train --steps -3 failed in OneCycleLR, --ckpt-every 0 divided by zero) or a silent clamp
    (synth --count -3 wrote nothing, exit 0)."""
    import argparse

    import pytest

    from app.argtypes import non_negative_int, positive_int

    assert positive_int("3") == 3 and non_negative_int("0") == 0
    for bad in ("0", "-3", "x", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_int(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        non_negative_int("-1")
