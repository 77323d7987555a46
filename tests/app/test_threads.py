"""LIDARSEG_THREADS: the cgroup CPU quota (v2 cpu.max, v1 cfs quota / period) else the CPUs we may
run on; the OpenMP variables that keep threads from spin-waiting on a shared CPU."""

from __future__ import annotations

import os
import subprocess
import sys

from app import threads
from tests.conftest import REPO_ROOT


def test_cgroup_quota(tmp_path):
    v2 = tmp_path / "cpu.max"
    v1 = (tmp_path / "quota", tmp_path / "period")
    v2.write_text("150000 100000\n")
    assert threads.cgroup_cpus(v2, v1) == 1.5
    v2.write_text("max 100000\n")
    assert threads.cgroup_cpus(v2, v1) is None
    v2.unlink()
    v1[0].write_text("250000\n")
    v1[1].write_text("100000\n")
    assert threads.cgroup_cpus(v2, v1) == 2.5
    v1[0].write_text("-1\n")
    assert threads.cgroup_cpus(v2, v1) is None


def test_default_threads_follow_the_quota(monkeypatch):
    monkeypatch.setattr(threads, "available_cpus", lambda: 8)
    monkeypatch.setattr(threads, "cgroup_cpus", lambda: 1.5)
    assert threads.default_threads() == 1
    monkeypatch.setattr(threads, "cgroup_cpus", lambda: 32.0)
    assert threads.default_threads() == 8
    monkeypatch.setattr(threads, "cgroup_cpus", lambda: None)
    assert threads.default_threads() == 8


def test_configure_env():
    env = {"LIDARSEG_THREADS": "3"}
    assert threads.configure_env(env=env) == 3
    assert env == {
        "LIDARSEG_THREADS": "3",
        "OMP_NUM_THREADS": "3",
        "OMP_WAIT_POLICY": "PASSIVE",
        "GOMP_SPINCOUNT": str(threads.OMP_SPIN_COUNT),
    }
    mine = {"OMP_NUM_THREADS": "5", "OMP_WAIT_POLICY": "ACTIVE"}  # the user's own win
    threads.configure_env(env=mine)
    assert mine["OMP_NUM_THREADS"] == "5" and mine["OMP_WAIT_POLICY"] == "ACTIVE"


def test_python_m_app_sets_torch_threads_before_libgomp_loads():
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
    }
    env["LIDARSEG_THREADS"] = "1"
    code = (
        "import runpy, sys; sys.argv = ['app', '--help']\n"
        "from app.threads import configure_env; configure_env()\n"
        "import os, torch; print(torch.get_num_threads(), os.environ['OMP_WAIT_POLICY'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.split() == ["1", "PASSIVE"], out.stderr
