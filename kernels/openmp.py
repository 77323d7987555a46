"""How many OpenMP threads the kernels called from this thread use.

The CPU kernels (csrc/*_cpu.cpp) run their parallel loops on libgomp.so.1, as torch's CPU build
does, and size each team by the calling thread's own count (omp_get_max_threads; libgomp keeps it
per thread). `threads_here(1)` lets two Python threads each run kernels on one core at once (the
maps stage's two chains, models/sparse_tensor.py) instead of one thread running them on two
cores in turn. Without libgomp (a build against another OpenMP runtime) it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from collections.abc import Iterator
from typing import Any


@functools.lru_cache(maxsize=1)
def _libgomp() -> Any:
    name = ctypes.util.find_library("gomp") or "libgomp.so.1"
    try:
        lib = ctypes.CDLL(name)
        lib.omp_get_max_threads.restype = ctypes.c_int
        lib.omp_set_num_threads.argtypes = [ctypes.c_int]
        return lib
    except (OSError, AttributeError):  # pragma: no cover - no libgomp on this host
        return None


def max_threads() -> int:
    """The calling thread's OpenMP thread count (1 without libgomp)."""
    lib = _libgomp()
    return int(lib.omp_get_max_threads()) if lib is not None else 1


def set_threads_here(n: int) -> None:
    """Sets the calling thread's OpenMP thread count (other threads keep theirs)."""
    lib = _libgomp()
    if lib is not None:
        lib.omp_set_num_threads(max(int(n), 1))


@contextlib.contextmanager
def threads_here(n: int) -> Iterator[None]:
    """Within: kernels called from this thread use n OpenMP threads; the count is restored."""
    before = max_threads()
    set_threads_here(n)
    try:
        yield
    finally:
        set_threads_here(before)
