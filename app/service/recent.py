"""The last N requests to /v1/segment, in memory, for the built-in dashboard (/v1/requests).

Each entry is a small summary (ids, status, counts, stage times). The frame's points and labels
are kept too (references to the arrays the request already made, no copy) while they fit in the
memory budget; past it the oldest entries' points and labels are let go (with them their class
counts, which are counted only when asked for: nothing is counted on the request path). Budget 0
keeps no points; size 0 keeps nothing. Only the event-loop thread touches a ring.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from models.labels import IGNORE_LABEL


def held_bytes(a: np.ndarray) -> int:
    """What keeping `a` keeps alive: a view holds its whole base buffer (e.g. the request body)."""
    base: Any = a  # the owner of the memory: an ndarray, bytes, an mmap, ...
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    try:
        return max(a.nbytes, memoryview(base).nbytes)
    except TypeError:
        return a.nbytes


@dataclass
class Entry:
    summary: dict
    points: np.ndarray | None = None  # float32 [N, >=3]
    labels: np.ndarray | None = None  # [N] ints, 255 = ignored
    nbytes: int = 0


@dataclass
class RequestRing:
    size: int
    budget_bytes: int
    class_names: list[str] = field(default_factory=list)
    _entries: collections.OrderedDict = field(default_factory=collections.OrderedDict)
    _kept: collections.deque = field(default_factory=collections.deque)  # ids holding points
    kept_bytes: int = 0

    @property
    def enabled(self) -> bool:
        return self.size > 0

    def add(self, summary: dict, points: np.ndarray | None, labels: np.ndarray | None) -> None:
        if self.size <= 0:
            return
        entry = Entry(summary)
        rid = summary["id"]
        if rid in self._entries:  # a client reused its X-Request-Id
            self._release(self._entries.pop(rid))
        self._entries[rid] = entry
        while len(self._entries) > self.size:
            self._release(self._entries.popitem(last=False)[1])
        if points is None or labels is None or self.budget_bytes <= 0:
            return
        nbytes = held_bytes(points) + held_bytes(labels)
        if nbytes > self.budget_bytes:
            return
        entry.points, entry.labels, entry.nbytes = points, labels, nbytes
        self._kept.append(rid)
        self.kept_bytes += nbytes
        while self.kept_bytes > self.budget_bytes and self._kept:
            old = self._entries.get(self._kept[0])
            self._kept.popleft()
            if old is not None:
                self._release(old)

    def _release(self, entry: Entry) -> None:
        if entry.labels is not None:
            self.kept_bytes -= entry.nbytes
            entry.points = entry.labels = None
            entry.nbytes = 0
            try:
                self._kept.remove(entry.summary["id"])
            except ValueError:
                pass

    def counts(self, labels: np.ndarray) -> dict[str, int]:
        c = np.bincount(np.asarray(labels, dtype=np.int64), minlength=256)
        out = {self._name(int(i)): int(c[i]) for i in np.flatnonzero(c)}
        return out

    def _name(self, i: int) -> str:
        if i == IGNORE_LABEL:
            return "ignore"
        return self.class_names[i] if i < len(self.class_names) else str(i)

    def get(self, rid: str) -> Entry | None:
        return self._entries.get(rid)

    def detail(self, entry: Entry) -> dict:
        counts = self.counts(entry.labels) if entry.labels is not None else None
        return {**entry.summary, "has_points": entry.labels is not None, "class_counts": counts}

    def listing(self, limit: int | None = None) -> list[dict]:
        """Newest first."""
        out = []
        for entry in reversed(self._entries.values()):
            out.append({**entry.summary, "has_points": entry.labels is not None})
            if limit is not None and len(out) >= limit:
                break
        return out

    def stats(self, window_s: float = 60.0) -> dict:
        """Latency percentiles of the successful requests held, and throughput over the window."""
        now = time.time()
        totals = [
            e.summary["timing_ms"].get("total", 0.0)
            for e in self._entries.values()
            if e.summary["status"] == 200
        ]
        recent = sum(1 for e in self._entries.values() if now - e.summary["time"] <= window_s)
        if self._entries and len(self._entries) >= self.size:  # full: the ring may span less
            oldest = next(iter(self._entries.values())).summary["time"]
            window_s = max(min(window_s, now - oldest), 1e-3)
        pct = (
            {f"p{q}": round(float(np.percentile(totals, q)), 3) for q in (50, 95, 99)}
            if totals
            else {"p50": None, "p95": None, "p99": None}
        )
        return {
            "requests": len(self._entries),
            "ok": len(totals),
            **pct,
            "throughput_rps": round(recent / window_s, 3),
            "window_s": window_s,
            "kept_points_bytes": self.kept_bytes,
            "budget_bytes": self.budget_bytes,
            "size": self.size,
        }
