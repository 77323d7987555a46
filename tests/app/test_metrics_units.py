"""app/service/metrics.py without a server: stage times go in as seconds, into 10 ms buckets up
to a 10 Hz sensor's 0.1 s period."""

from __future__ import annotations

import pytest

from app.service.metrics import Metrics


def bucket(m: Metrics, stage: str, le: str) -> float:
    value = m.registry.get_sample_value(
        "lidarseg_stage_duration_seconds_bucket", {"stage": stage, "le": le}
    )
    assert value is not None, (stage, le)
    return value


def test_stage_times_are_observed_in_seconds():
    m = Metrics()
    m.observe_stages({"network": 42.0, "total": 95.0})
    total = m.registry.get_sample_value("lidarseg_stage_duration_seconds_sum", {"stage": "total"})
    assert total == pytest.approx(0.095)
    assert bucket(m, "network", "0.04") == 0 and bucket(m, "network", "0.05") == 1


def test_a_dashboard_tells_95_ms_from_105():
    m = Metrics()
    m.observe_stages({"total": 95.0, "network": 105.0})
    for ms in range(10, 101, 10):  # a bucket every 10 ms up to 0.1 s
        bucket(m, "total", repr(ms / 1e3))
    assert bucket(m, "total", "0.09") == 0 and bucket(m, "total", "0.1") == 1
    assert bucket(m, "network", "0.1") == 0 and bucket(m, "network", "0.125") == 1
