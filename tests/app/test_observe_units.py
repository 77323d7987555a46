"""app/service/observe.py without a model or a server: the ring's budget unit, the exemplar with
tracing off, and where the stage spans start."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from app.inference.pipeline import STAGES
from app.service.observe import RECORD_KEY, TRACE_KEY, Observability, record
from app.service.tracing import Tracing
from tests.app.inproc_helpers import ready_service


def test_dashboard_points_mb_counts_mebibytes():
    """LIDARSEG_DASHBOARD_POINTS_MB is in MiB, as the README's 64 and the ring test's 0.001 MB
    = 1048 B say."""
    obs = Observability(ready_service(dashboard_points_mb=1.5), Tracing(None))
    assert obs.ring.budget_bytes == 3 << 19
    assert obs.ring.size == obs.service.settings.dashboard_requests


def recorded(obs: Observability, timing: dict[str, float], t_body: float, t_enc: float):
    rt = obs.tracing.start("POST", None, {})
    request = SimpleNamespace(
        scope={"state": {TRACE_KEY: rt}}, app=SimpleNamespace(state=SimpleNamespace(observe=obs))
    )
    result = SimpleNamespace(
        num_points=5, num_voxels=3, ignored_points=0, labels=np.zeros(5, np.uint8)
    )
    exemplar = record(
        request, timing=timing, result=result, batch_size=1, fmt="kitti", body=b"",
        content_type=None, points=np.zeros((5, 4), np.float32), cleaned=0, t_body=t_body,
        t_enc=t_enc,
    )  # fmt: skip
    return rt, exemplar, request.scope["state"][RECORD_KEY]


def test_stage_spans_lie_end_to_end_from_the_measured_times():
    obs = Observability(ready_service(), Tracing(None))
    timing = dict(zip(STAGES, (2.0, 1.0, 3.0, 4.0, 1.0, 5.0, 1.0, 0.5)))
    _, _, rec = recorded(obs, timing, t_body=100.0, t_enc=200.0)
    stages = {name: (start, ms) for name, start, ms in rec["stages"]}
    assert list(stages) == list(STAGES)
    assert stages["receive"] == (pytest.approx(99.998), 2.0)  # it ends where the body arrived
    end = 99.998
    for name in STAGES[:-1]:  # each stage starts where the one before ended
        start, ms = stages[name]
        assert start == pytest.approx(end, abs=1e-9), name
        end = start + ms / 1e3
    assert stages["encode"] == (200.0, 0.5)  # after the wait for the result


def test_with_tracing_off_the_exemplar_still_carries_the_trace_id():
    """Tracing off, an untraced request's id is all there is: the exemplar links the access
    log and /v1/requests (only a sampler's left-out trace has none)."""
    obs = Observability(ready_service(), Tracing(None))
    rt, exemplar, _ = recorded(obs, {"total": 1.0}, 1.0, 2.0)
    assert not rt.sampled and exemplar == {"trace_id": rt.trace_id}
    obs = Observability(ready_service(exemplars=False), Tracing(None))
    assert recorded(obs, {"total": 1.0}, 1.0, 2.0)[1] is None
