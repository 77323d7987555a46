"""How many threads the process computes with: LIDARSEG_THREADS, else what the box allows.

The default is the cgroup CPU quota (a container limited to 1.5 CPUs gets 1), else the CPUs this
process may run on. The count goes to torch (intra-op threads) and to OpenMP (torch's and our
kernels'). OpenMP's threads spin only briefly before they sleep (OMP_WAIT_POLICY=passive,
GOMP_SPINCOUNT=OMP_SPIN_COUNT): on a CPU shared with another process, threads spinning at a
barrier for long steal the core from the one thread that still works (a frame about 12x slower
with one of two cores taken), while threads that sleep at once pay a wake-up (about 40 us here)
at each of a frame's 145 parallel regions.

configure_env() must run before libgomp loads (before torch is imported: `python -m app` calls
it first); apply_threads() sets torch's count at run time. Variables already set by the user win
over the wait-policy defaults; OMP_NUM_THREADS follows LIDARSEG_THREADS when that is set.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

CGROUP_V2 = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1 = (
    Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
    Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
)


def cgroup_cpus(v2: Path = CGROUP_V2, v1: tuple[Path, Path] = CGROUP_V1) -> float | None:
    """The cgroup CPU quota in CPUs (cpu.max or cfs_quota_us / cfs_period_us), None if unlimited."""
    try:
        quota, period = v2.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us, period_us = (int(p.read_text()) for p in v1)
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    """The cgroup quota rounded down (at least 1), capped by the CPUs we may run on."""
    cpus = available_cpus()
    quota = cgroup_cpus()
    return cpus if quota is None else max(1, min(cpus, math.floor(quota)))


def requested_threads(env: Mapping[str, str] | None = None) -> int:
    """LIDARSEG_THREADS when it is a positive integer, else default_threads() (0 = automatic;
    a bad value is left for the settings to refuse at start-up)."""
    raw = (env if env is not None else os.environ).get("LIDARSEG_THREADS", "").strip()
    try:
        n = int(raw)
    except ValueError:
        n = 0
    return n if n > 0 else default_threads()


# libgomp's spin iterations before a waiting thread sleeps: about 50-100 us on the 2-core EPYC,
# enough to bridge the Python between two kernels. Measured there (README, Threads): a frame
# over HTTP 109-111 ms against 115-119 with 0; with one of the two cores taken by a busy loop,
# 4.61 frames/s against 4.90 with 0 and 3.78 with 10,000.
OMP_SPIN_COUNT = 3000


def configure_env(threads: int | None = None, env: MutableMapping[str, str] | None = None) -> int:
    """Sets the OpenMP variables (before libgomp loads); returns the thread count."""
    if env is None:
        env = os.environ
    n = threads or requested_threads(env)
    if env.get("LIDARSEG_THREADS", "").strip() not in ("", "0") or "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(n)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("GOMP_SPINCOUNT", str(OMP_SPIN_COUNT))
    return n


def apply_threads(threads: int) -> None:
    """torch's intra-op threads (and so its OpenMP pool) at run time."""
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
