"""Admission and waiting at their exact bounds, in process, no model: a job at its deadline is not
started, drops counted for the right reason, the client's X-Deadline-Ms under the setting kept,
the queue's last slot. (From a hand-made mutation audit, 2026-12-06: each test kills a mutant
the suite let live.)"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from starlette.requests import Request

from app.service.admission import (
    CLIENT_GONE,
    DEADLINE,
    CostModel,
    DeadlineExceeded,
    refuse,
    start_jobs,
)
from app.service.routes.waiting import Deadline, admit, request_deadline, wait_result
from app.service.state import ServiceError
from tests.app.inproc_helpers import asgi_request, ready_service
from tests.app.worker_helpers import queued_job


def test_start_jobs_drops_a_job_whose_deadline_passed_while_its_batch_formed():
    """admission.py start_jobs: `now >= job.deadline` (a mutant that let late jobs start
    survived: the worker's own refuse() runs before the batch forms, so no worker test reaches
    this check)."""
    drops: list[str] = []
    now = time.monotonic()
    late, live = queued_job(now - 0.001), queued_job(now + 30)
    on_time = queued_job(now)  # exactly at its deadline: too late as well
    started = start_jobs([late, on_time, live], now, drops.append)
    assert started == [live] and live.started and live.future.running()
    for job in (late, on_time):
        assert not job.started
        with pytest.raises(DeadlineExceeded):
            job.future.result(0)
    assert drops == [DEADLINE, DEADLINE]


def test_refuse_names_why_a_cancelled_job_was_given_up():
    """admission.py refuse: a job cancelled because its client left is counted as client_gone
    (lidarseg_dropped{reason}), not as a deadline."""
    drops: list[str] = []
    job = queued_job(time.monotonic() + 30)
    job.abandoned = CLIENT_GONE
    job.future.cancel()
    assert refuse(CostModel(), job, time.monotonic(), drops.append) is True
    assert drops == [CLIENT_GONE]


@pytest.mark.parametrize("ms, expected_s", [("5000", 5.0), ("29999", 29.999), ("250", 0.25)])
def test_a_client_deadline_under_the_setting_is_kept(ms, expected_s):
    """waiting.py request_deadline compares seconds with seconds: 5000 ms under a 30 s setting
    is the client's 5 s (a mutant comparing milliseconds with seconds kept the server's 30 s for
    every value above 30 ms; the contract test only sends 0.001 and 600000)."""
    service = ready_service(deadline_s=30)
    before = time.monotonic()
    deadline = request_deadline(asgi_request([(b"x-deadline-ms", ms.encode())]), service)
    assert deadline.budget == f"{expected_s:g} s (X-Deadline-Ms)"
    assert before + expected_s <= deadline.at <= time.monotonic() + expected_s


def test_admit_refuses_once_the_queue_holds_queue_size():
    """waiting.py admit: 503 queue_full with Connection: close (the body left unread) when the
    queue holds queue_size jobs: `>=`, not `>` (the worker's own check would answer later, after
    reading and decoding the whole body, without the close)."""
    service = ready_service(queue_size=2)
    service.worker = SimpleNamespace(depth=1)
    admit(service)  # one free slot: admitted
    service.worker.depth = 2
    with pytest.raises(ServiceError) as e:
        admit(service)
    assert (e.value.status, e.value.code) == (503, "queue_full")
    assert e.value.headers["Connection"] == "close"


@pytest.mark.parametrize("gone", [True, False])
def test_a_frame_given_up_is_dropped_for_the_right_reason(gone):
    """waiting.py wait_result: a client that disconnects while its frame waits gets 499 and the
    job is dropped as client_gone; a deadline that passes first is a 504 and a drop for the
    deadline (lidarseg_dropped{reason}: a mutant counting every drop as a deadline survived)."""
    service = ready_service()
    reasons: list[str] = []
    service.worker = SimpleNamespace(cancel=lambda job, reason: reasons.append(reason) or True)
    job = queued_job(time.monotonic() + 30)
    request = asgi_request([]) if gone else Request({"type": "http"}, _never_disconnects)
    deadline = Deadline(time.monotonic() + (30 if gone else 0.05), "test")
    with pytest.raises(ServiceError) as e:
        asyncio.run(wait_result(request, service, job, deadline))
    assert e.value.status == (499 if gone else 504)
    assert reasons == [CLIENT_GONE if gone else DEADLINE]


async def _never_disconnects():
    await asyncio.Event().wait()
