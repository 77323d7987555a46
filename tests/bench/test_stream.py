"""bench.stream: frames are due at the sensor's rate whatever the answers do (open loop), and the
summary's figures on known latencies."""

from __future__ import annotations

import math
import threading
import time

from bench.stream import stream, summary


class SlowPoster:
    """Answers after `ms`, recording when each frame was posted against when it was due."""

    def __init__(self, ms: float):
        self.ms, self.posted, self.lock = ms, {}, threading.Lock()

    def post(self, i: int, due: float) -> dict:
        with self.lock:
            self.posted[i] = (due, time.perf_counter())
        time.sleep(self.ms / 1e3)
        return {"ms": (time.perf_counter() - due) * 1e3, "status": 200, "stages": {}}


def test_frames_are_posted_when_due_though_answers_take_longer_than_a_period():
    poster = SlowPoster(ms=250)  # 2.5 periods at 10 Hz: a closed loop would post 4 in a second
    results = stream(poster, hz=10, count=10)
    dues = [poster.posted[i][0] for i in range(10)]
    assert all(abs((b - a) - 0.1) < 1e-9 for a, b in zip(dues, dues[1:]))
    # on time (a closed loop would post the last at 2.25 s, 1.35 s after it was due)
    assert all(posted - due < 0.5 for due, posted in poster.posted.values())
    assert all(r["ms"] >= 250 for r in results)


def test_summary_of_known_latencies():
    """Latencies of the answered frames only (a 504 comes fast: it is no fresh label)."""
    results = [
        {"ms": float(ms), "status": 200 if ms < 100 else 504, "stages": {"queue": 2.0}}
        for ms in range(1, 102)
    ]
    s = summary(results, period_ms=89)
    assert s["frames"] == 101 and s["p50_ms"] == 50 and s["max_ms"] == 99
    assert s["late_share"] == 10 / 99 and s["not_200"] == 2 and s["queue_ms"] == 2.0
    assert s["network_ms"] == 0.0
    refused = summary([{"ms": 5.0, "status": 504, "stages": {}}], period_ms=100)
    assert refused["not_200"] == 1 and math.isnan(refused["p50_ms"])
