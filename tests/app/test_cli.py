"""The command line, run as users run it (a subprocess), on a real frame."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.codecs.files import posting_format
from tests.conftest import REPO_ROOT, require_real_data

NUSCENES = "nuscenes/n015-2018-07-24-11-22-45+0800__LIDAR_TOP__1532402927647951.pcd.bin"


def run_app(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
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


def test_bad_frame_is_a_clear_error(tmp_path):
    bad = tmp_path / "broken.bin"
    bad.write_bytes(b"\x00" * 10)
    proc = subprocess.run(
        [sys.executable, "-m", "app", "segment", str(bad)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "not a whole number of kitti points" in proc.stderr


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
