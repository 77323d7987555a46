"""bench.pause's readings: the page faults and CPU time it reads around a request are the
process's own (known values: fresh pages touched, a busy loop run), and the --config syntax it
shares with bench.soak (bench.common.parse_config)."""

from __future__ import annotations

import mmap
import os
import threading
import time

from bench.common import parse_config
from bench.pause import cpu_ns, minor_faults

PAGE = mmap.PAGESIZE


def test_minor_faults_count_every_fresh_page_touched_by_any_thread():
    pages = 2000
    buf = mmap.mmap(-1, pages * PAGE)  # anonymous: each page faults in at its first touch
    before = minor_faults(os.getpid())

    def touch():
        for i in range(0, pages * PAGE, PAGE):
            buf[i] = 1

    worker = threading.Thread(target=touch)  # another thread's faults are the process's too
    worker.start()
    worker.join()
    took = minor_faults(os.getpid()) - before
    buf.close()
    assert pages <= took < pages + 500


def test_cpu_time_sums_the_threads_and_leaves_out_sleep():
    def spin(seconds):
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    before = cpu_ns(os.getpid())
    time.sleep(0.2)
    slept = cpu_ns(os.getpid()) - before
    spun, done = threading.Event(), threading.Event()

    def work():  # the thread stays alive until read: like the server's worker
        spin(0.2)
        spun.set()
        done.wait(10)

    worker = threading.Thread(target=work)
    before = cpu_ns(os.getpid())
    worker.start()
    spin(0.1)
    spun.wait(10)
    busy = cpu_ns(os.getpid()) - before
    done.set()
    worker.join()
    assert slept < 0.05e9
    assert 0.28e9 <= busy < 0.6e9


def test_configs_name_their_environment():
    assert parse_config("shipped=") == ("shipped", {})
    assert parse_config("a=LIDARSEG_TRIM_IDLE_S=0.5,MALLOC_ARENA_MAX=2") == (
        "a",
        {"LIDARSEG_TRIM_IDLE_S": "0.5", "MALLOC_ARENA_MAX": "2"},
    )
