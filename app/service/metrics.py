"""Prometheus metrics, one registry per app (several apps can live in one test process)."""

from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
)

from app.inference.pipeline import STAGES as REQUEST_STAGES

STAGES = REQUEST_STAGES + ("total",)  # the request stages and their total, as timed per request
# seconds; 10 ms steps up to 0.1 s, a 10 Hz sensor's period, so a dashboard tells 95 ms from
# 105 (until 2026-12-06 the buckets went 0.05, 0.1, 0.25: 101 and 249 ms looked the same)
MS_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.03,
    0.04,
    0.05,
    0.06,
    0.07,
    0.08,
    0.09,
    0.1,
    0.125,
    0.15,
    0.2,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


class Metrics:
    """The service's metrics, in its own registry."""

    def __init__(self):
        self.registry = r = CollectorRegistry(auto_describe=True)
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            r.register(collector)  # process_resident_memory_bytes, CPU, fds, GC, Python
        self._declare_latency(r)
        self._declare_traffic(r)
        self._declare_worker(r)
        # each stage's histogram, found once: labels() checks its arguments on every call
        # (eight stages a request: 86 -> 51 us on a Zen 1 core)
        self._stage_of = {name: self.stage.labels(stage=name) for name in STAGES}

    def _declare_latency(self, r: CollectorRegistry) -> None:
        """Time per stage and per request."""
        self.stage = Histogram(
            "lidarseg_stage_duration_seconds",
            "Time per stage of answered segment requests (a batched frame reports its batch's "
            "voxelize, maps, network and devoxelize)",
            ["stage"],
            buckets=MS_BUCKETS,
            registry=r,
        )
        self.segment_seconds = Histogram(
            "lidarseg_segment_duration_seconds",
            "Time from a segment request's arrival to its answer, every outcome (status: 200, "
            "4xx, 499 client gone, 503, 504)",
            ["status"],
            buckets=MS_BUCKETS,
            registry=r,
        )

    def _declare_traffic(self, r: CollectorRegistry) -> None:
        """What arrives: requests, errors, refused connections, frames' sizes."""
        self.requests = Counter(
            "lidarseg_requests",
            "Requests to /v1/* by route (its template; 'other' when none matched) and status",
            ["route", "status"],
            registry=r,
        )
        self.errors = Counter(
            "lidarseg_errors",
            "Error answers to /v1/* by route and error code (the JSON body's 'error')",
            ["route", "code"],
            registry=r,
        )
        self.connection_rejects = Counter(
            "lidarseg_connection_rejects",
            "Connections answered and closed before any route (reason: too_many_connections, "
            "header_timeout, bad_request)",
            ["reason"],
            registry=r,
        )
        self.in_flight = Gauge(
            "lidarseg_requests_in_flight", "Requests to /v1/* being served", registry=r
        )
        self.points = Histogram(
            "lidarseg_points_per_request",
            "Points per segmented frame",
            buckets=(1e3, 1e4, 3e4, 6e4, 1e5, 1.5e5, 2e5, 3e5, 5e5, 1e6, 2e6),
            registry=r,
        )
        self.voxels = Histogram(
            "lidarseg_voxels_per_request",
            "Voxels per segmented frame",
            buckets=(1e3, 1e4, 3e4, 6e4, 1e5, 1.5e5, 2e5, 3e5, 5e5, 1e6),
            registry=r,
        )
        self.cleaned = Counter(
            "lidarseg_cleaned_points",
            "Points whose intensity was clamped to the format's range or whose later columns "
            "were not finite (zeroed) before inference",
            registry=r,
        )

    def _declare_worker(self, r: CollectorRegistry) -> None:
        """The worker: its queue, frames dropped or wasted, batches, restarts, the model."""
        self.queue_depth = Gauge(
            "lidarseg_queue_depth", "Requests waiting for the worker", registry=r
        )
        self.dropped = Counter(
            "lidarseg_dropped",
            "Frames never run: their deadline could not be met or passed (reason=deadline: at "
            "submit, in the queue or in a forming batch), their client left (client_gone), or a "
            "newer frame of their X-Stream-Id took their place in the queue (superseded)",
            ["reason"],
            registry=r,
        )
        self.wasted_runs = Counter(
            "lidarseg_wasted_runs",
            "Frames run (or running) whose answer nobody received: the deadline passed "
            "(reason=deadline) or the client left (client_gone) while they ran",
            ["reason"],
            registry=r,
        )
        self.batch_size = Histogram(
            "lidarseg_batch_size",
            "Frames per pipeline run",
            buckets=(1, 2, 3, 4, 6, 8, 16, 32, 64),
            registry=r,
        )
        self.worker_restarts = Counter(
            "lidarseg_worker_restarts",
            "Restarts of the supervised worker loop after an exception",
            registry=r,
        )
        self.model = Info("lidarseg_model", "The loaded model", registry=r)
        self.ready = Gauge("lidarseg_ready", "1 once the model is loaded and warmed", registry=r)

    def observe_stages(self, timing_ms: dict[str, float], exemplar: dict | None = None) -> None:
        for stage, ms in timing_ms.items():
            histogram = self._stage_of.get(stage) or self.stage.labels(stage=stage)
            histogram.observe(ms / 1e3, exemplar)
