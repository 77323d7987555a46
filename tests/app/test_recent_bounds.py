"""The dashboard's ring of recent requests (app/service/recent.py) at its edges: a frame of
exactly the budget, a reused request id, the ignored points' name."""

from __future__ import annotations

import numpy as np

from app.service.recent import RequestRing


def summary(rid: str) -> dict:
    return {"id": rid, "status": 200, "time": 0.0, "timing_ms": {"total": 1.0}}


def frame(n: int = 10) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((n, 4), np.float32), np.zeros(n, np.uint8)  # 17 bytes a point


def test_a_frame_of_exactly_the_budget_keeps_its_points():
    ring = RequestRing(4, 170)
    ring.add(summary("a"), *frame())
    assert ring.get("a").points is not None and ring.kept_bytes == 170
    ring = RequestRing(4, 169)  # one byte short
    ring.add(summary("a"), *frame())
    assert ring.get("a").points is None and ring.kept_bytes == 0


def test_a_reused_request_id_lets_the_old_points_go():
    """A client that reuses its X-Request-Id replaces the entry: the old points leave the
    budget (else they were counted for ever, and the new frame's points evicted at once)."""
    ring = RequestRing(4, 200)
    for _ in range(3):
        ring.add(summary("a"), *frame())
        assert ring.kept_bytes == 170
        assert ring.get("a").points is not None
    assert [e["id"] for e in ring.listing()] == ["a"]
    ring.add(summary("b"), *frame())  # over the budget: only the newest keeps its points
    assert ring.kept_bytes == 170
    assert ring.get("a").points is None and ring.get("b").points is not None


def test_class_counts_name_the_ignored_points_ignore():
    ring = RequestRing(4, 0, class_names=["car", "road"])
    labels = np.array([0, 255, 1, 1, 7], np.uint8)
    assert ring.counts(labels) == {"car": 1, "ignore": 1, "road": 2, "7": 1}
