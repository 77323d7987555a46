"""LIDARSEG_THREADS: the cgroup CPU quota (v2 cpu.max, v1 cfs quota / period) else the CPUs we may
run on; the OpenMP variables that keep threads from spin-waiting on a shared CPU."""

from __future__ import annotations

import json
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
    out = run_python(code, env)
    assert out.stdout.split() == ["1", "PASSIVE"], out.stderr


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`python -c code` in the repository, with env, its output captured."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# Run in a process of its own: other tests' threads (servers, executors) start and end while
# this looks.
TEAM_CHECK = """
import json, os, threading
from types import SimpleNamespace

from app.threads import configure_env

configure_env()
import numpy as np  # noqa: E402

from app.codecs.encode import encode  # noqa: E402
from app.inference.voxel_config import VoxelizeConfig  # noqa: E402
from app.inference.voxelize import voxel_kernels  # noqa: E402
from app.service.routes.decoding import Posted, decode_frame  # noqa: E402
from kernels.labels import labels_json  # noqa: E402


def threads_outside_python():
    # ids of threads Python did not start (OpenMP team members, torch's pools); by id, not by
    # count: a Python thread that was just joined can still show in /proc/self/task for a moment
    python = {t.native_id for t in threading.enumerate()}
    return {int(tid) for tid in os.listdir("/proc/self/task")} - python


def new_threads_while(work):
    # threads that work() starts and leaves behind in a fresh Python thread, seen before it exits
    # (an OpenMP team belongs to the thread that started it and lives as long as that thread)
    seen = {}

    def run():
        before = threads_outside_python()
        work()
        seen["new"] = len(threads_outside_python() - before)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return seen["new"]


rng = np.random.default_rng(0)
points = rng.uniform([-40, -40, -2, 0], [40, 40, 2, 1], (120_000, 4)).astype(np.float32)
config = VoxelizeConfig()
service = SimpleNamespace(
    settings=SimpleNamespace(max_points=200_000, range_policy="clip"),
    pipeline=SimpleNamespace(voxel_config=config),
)
found = {}
for fmt in ("kitti", "json", "ply", "pcd"):
    body, content_type = encode(points, fmt)
    decoded = []
    found[fmt] = new_threads_while(
        lambda: decoded.append(decode_frame(service, Posted(body, fmt, content_type, "t"))[0])
    )
    assert len(decoded[0]) == len(points), fmt
labels = rng.integers(0, 20, len(points)).astype(np.uint8)
found["labels_json"] = new_threads_while(lambda: labels_json(labels))  # the JSON response
grid = voxel_kernels.Grid((-500, -500, -30), (1000, 1000, 60))
found["voxel_keys"] = new_threads_while(
    lambda: voxel_kernels.voxel_keys(points, 0.1, config.max_xy, config.z_range, grid)
)
print(json.dumps(found))
"""


def test_decoding_starts_no_openmp_team():
    """Only the worker thread may run OpenMP regions. Decoding runs on the event loop (raw
    float32) or on the decode pool, and a JSON response's labels are written on the event loop;
    a parallel region there gives the process a second team, more threads under libgomp than
    CPUs, and libgomp then stops spinning altogether (its throttled spin count is 0 under
    OMP_WAIT_POLICY=passive): every parallel region of a frame pays a wake-up again (server
    network stage 74 -> 80-84 ms, measured). Counted in a process of its own with two OpenMP
    threads; the voxelizer's keys pass, which runs in parts on every thread, shows that the
    count sees a team."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    env["LIDARSEG_THREADS"] = "2"
    out = run_python(TEAM_CHECK, env)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.splitlines()[-1])
    assert found == {"kitti": 0, "json": 0, "ply": 0, "pcd": 0, "labels_json": 0, "voxel_keys": 1}
