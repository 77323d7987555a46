"""bench.sensor_rate: the steps and what each compares on a CPU's features, and one quick step
run for real into its output folder."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench import sensor_rate
from tests.conftest import REPO_ROOT, require_real_data

ZEN4 = ("AVX512_BF16", "AVX512_VNNI", "AVX512F", "AVX2")
XEON_AMX = ("AMX_BF16", "AMX_TILE", "AVX512_BF16", "AVX512_VNNI", "AVX_VNNI", "AVX512F", "AVX2")


@pytest.mark.parametrize(
    "features,expected",
    [
        (ZEN4, ["fp32", "bf16", "int8", "int8@avx2"]),
        (XEON_AMX, ["fp32", "bf16", "int8", "int8@avx_vnni", "int8@avx2", "int8-avx512",
                    "bf16-avx512"]),
        (("AVX2",), ["fp32", "bf16", "int8", "int8@avx2"]),
        ((), ["fp32", "bf16", "int8"]),
    ],
)  # fmt: skip
def test_precision_compares_every_kernel_the_cpu_has(features, expected):
    assert sensor_rate.precisions(features) == expected
    argv, _ = sensor_rate.commands(False, features)["precision"]
    assert argv[argv.index("--precisions") + 1 :][: len(expected)] == expected


def test_every_step_is_a_command_and_quick_runs_each_twice():
    full, quick = sensor_rate.commands(False, ZEN4), sensor_rate.commands(True, ZEN4)
    assert list(full) == list(sensor_rate.STEPS)
    assert full["service"][1] == {"LIDARSEG_ACCESS_LOG": "off"}
    for name in ("precision", "voxelize", "service", "scaling"):
        assert full[name][0][1] == f"bench.{name}"
        assert quick[name][0][quick[name][0].index("--runs") + 1] == "2"


def test_a_quick_step_writes_its_output_and_the_summary(tmp_path):
    require_real_data()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.sensor_rate", "--steps", "voxelize", "--quick",
         "--out", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = (tmp_path / "summary.txt").read_text()
    assert summary.startswith("# bench.sensor_rate ") and "# CPU " in summary
    shown = f"## voxelize: python -m bench.voxelize --runs 2 --json {tmp_path / 'voxelize.json'}"
    assert shown + "\n# exit 0," in summary
    assert "voxelize / floor" in (tmp_path / "voxelize.txt").read_text()
    # the item judged from the figures the step wrote (a verdict either way, never n/a)
    (item2,) = [line for line in summary.splitlines() if " item 2: " in line]
    assert item2.startswith(("PASS", "FAIL")) and "kitti00 0.1 m x" in item2


def test_the_summary_says_when_the_commit_is_unknown(monkeypatch):
    """A bare machine without git (seen on a fresh Debian root) gets a header, not a crash."""
    assert sensor_rate.commit() != ""

    def no_git(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "git")

    monkeypatch.setattr(sensor_rate.subprocess, "run", no_git)
    assert sensor_rate.commit() == "unknown (no git on this machine)"
    assert "# commit unknown (no git on this machine)" in sensor_rate.header(["AVX2"])
