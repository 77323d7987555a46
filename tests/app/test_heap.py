"""app/heap.py: glibc's malloc parameters for a stream of frames, and who wins over them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app import heap


class FakeLibc:
    def __init__(self, answer: int = 1):
        self.calls, self.answer = [], answer

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.answer


def test_configure_malloc_sets_every_parameter_the_environment_leaves_open():
    libc = FakeLibc()
    done = heap.configure_malloc(env={}, libc=libc)
    assert libc.calls == [(-8, 1), (-1, 256 << 20), (-3, 32 << 20)]
    assert done == {
        "MALLOC_ARENA_MAX": 1,
        "MALLOC_TRIM_THRESHOLD_": 256 << 20,
        "MALLOC_MMAP_THRESHOLD_": 32 << 20,
    }


def test_an_environment_variable_wins_and_a_refused_value_is_not_reported():
    libc = FakeLibc()
    done = heap.configure_malloc(env={"MALLOC_ARENA_MAX": "2"}, libc=libc)
    assert [p for p, _ in libc.calls] == [-1, -3] and "MALLOC_ARENA_MAX" not in done
    assert heap.configure_malloc(env={}, libc=FakeLibc(answer=0)) == {}


@pytest.mark.skipif(heap.GLIBC is None, reason="not glibc")
def test_glibc_accepts_every_value():
    """The real mallopt takes all three (it answers 0 for a value it refuses), in a fresh
    process, as `python -m app` sets them."""
    code = "from app import heap; print(sorted(heap.configure_malloc(env={})))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == str(sorted(v for v, _, _ in heap.MALLOC_SETTINGS))
