"""glibc's heap, set for a stream of frames: buffers reused frame after frame, handed back to the
OS in a pause.

configure_malloc() (called by `python -m app` at start, before any thread exists) sets three of
glibc's malloc parameters, each unless its environment variable is already set (glibc read it
then, and it wins):
  - one arena (MALLOC_ARENA_MAX=1): the worker thread allocates from the main heap instead of a
    per-thread arena, whose heaps glibc shrinks and unmaps as soon as their top is free;
  - no automatic trim below 256 MiB of free heap top (MALLOC_TRIM_THRESHOLD_);
  - buffers up to 32 MiB from the heap, not from a fresh mmap each (MALLOC_MMAP_THRESHOLD_;
    glibc's own sliding threshold starts at 128 KiB and stops at 32 MiB).
Each frame's activations then reuse the pages of the frame before instead of faulting in new
ones: on seq00_000000 with the default model the worker thread took about 1,500 page faults per
frame instead of 3,200, and a frame over HTTP was 3.7 ms faster (median of paired requests,
README). The memory is not lost: HeapTrim calls malloc_trim(0) once the worker has paused.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Mapping
from typing import Any

# mallopt's parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
# (environment variable glibc reads at start, mallopt parameter, value)
MALLOC_SETTINGS = (
    ("MALLOC_ARENA_MAX", M_ARENA_MAX, 1),
    ("MALLOC_TRIM_THRESHOLD_", M_TRIM_THRESHOLD, 256 << 20),
    ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, 32 << 20),
)


def _glibc() -> Any:
    """The C library when it is glibc (it has mallopt and malloc_trim), else None."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc if libc is not None and libc.mallopt and libc.malloc_trim else None
    except (OSError, AttributeError):
        return None


GLIBC = _glibc()
MALLOC_TRIM = GLIBC.malloc_trim if GLIBC is not None else None


def configure_malloc(env: Mapping[str, str] | None = None, libc: Any = None) -> dict[str, int]:
    """Sets MALLOC_SETTINGS through mallopt, each unless its variable is in `env`; returns what
    was set (nothing without glibc)."""
    env = os.environ if env is None else env
    libc = GLIBC if libc is None else libc
    if libc is None:
        return {}
    done = {}
    for variable, param, value in MALLOC_SETTINGS:
        if variable not in env and libc.mallopt(param, value) == 1:
            done[variable] = value
    return done


class HeapTrim:
    """Hands freed heap back to the OS (glibc keeps it otherwise: RSS climbs under mixed load;
    README, Limits) once the batches since the last trim add up to `points` points (counted over
    batches, so a stream of small frames counts too) and the worker has had no job for a while.
    Trimming between two frames of a stream cost the next frame about 55 ms of page faults (the
    pipeline's freed buffers are mapped again): 225 against 169 ms over HTTP for seq00_000000
    with the default model."""

    def __init__(self, points: int):
        self.points, self.since = points, 0

    def after_batch(self, batch_points: int) -> None:
        self.since += batch_points  # the worker thread is the only caller

    def when_idle(self) -> None:
        trim = MALLOC_TRIM  # read at the call: tests replace it
        if self.since >= self.points and trim is not None:
            self.since = 0
            trim(0)


def worker_trim_hooks(points: int, idle_s: float) -> dict:
    """The worker's trim arguments: none when the trim is off or there is no glibc."""
    if not points or MALLOC_TRIM is None:
        return {}
    trim = HeapTrim(points)
    return {"after_batch": trim.after_batch, "on_idle": trim.when_idle, "idle_s": idle_s}
