"""Before a frame's body is read, and after its job is queued: admission (503 while the queue is
full or the decoders busy), the request's deadline (X-Deadline-Ms) and stream (X-Stream-Id), and
the wait for the worker's result under the deadline (504), dropping or writing off the job when
the client goes (499) or the deadline passes; 409 when a newer frame of its stream took its
place in the queue."""

from __future__ import annotations

import asyncio
import math
import re
import time
from typing import NamedTuple

from fastapi import Request

from app.service.admission import CLIENT_GONE, DEADLINE, DeadlineExceeded, Job, Superseded
from app.service.routes.decoding import decodes_inline
from app.service.state import ServiceError, ServiceState


def admit(service: ServiceState, inline: bool = False) -> None:
    """Before the body is read: 503 + Retry-After (closing the connection) when the queue is
    full, or every decode slot is taken and the body needs one (`inline`: a small raw body,
    decoded on the event loop, needs none: a flood of slow text bodies refused them too)."""
    service.require_ready()
    settings = service.settings
    if service.worker.depth >= settings.queue_size:
        raise ServiceError(
            503,
            "queue_full",
            f"server busy: {service.worker.depth} requests already waiting",
            service.retry_after(close=True),
        )
    if not inline and service.decoding >= settings.decode_slots:
        raise ServiceError(
            503,
            "decoders_busy",
            f"server busy: {service.decoding} frames being decoded (LIDARSEG_DECODE_CONCURRENCY)",
            service.retry_after(close=True),
        )


DEADLINE_HEADER = "X-Deadline-Ms"
STREAM_HEADER = "X-Stream-Id"
STREAM_ID = re.compile(r"[A-Za-z0-9._:/-]{1,64}")
_MILLISECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")  # a JSON-like number


class Deadline(NamedTuple):
    """When a request's answer is due (time.monotonic()), and what set it, for the 504's text."""

    at: float
    budget: str  # "0.15 s (X-Deadline-Ms)" or "30 s (LIDARSEG_DEADLINE_S)"


def one_header(request: Request, name: str) -> str | None:
    """The request's `name` header, None when absent; 400 when given more than once (which
    of two would win is no contract)."""
    values = request.headers.getlist(name)
    if len(values) > 1:
        raise ServiceError(400, "invalid_request", f"{name}: given more than once")
    return values[0] if values else None


def request_deadline(request: Request, service: ServiceState) -> Deadline:
    """From now: the client's X-Deadline-Ms (a robot's frame is worth nothing after its next
    scans: a stale one is dropped unrun or refused, not answered seconds late) when it asks for
    less than LIDARSEG_DEADLINE_S, else the setting (a number too large for a float too); 400 for
    a value that is no positive decimal number of milliseconds, or given twice."""
    setting = service.settings.deadline_s
    value = one_header(request, DEADLINE_HEADER)
    seconds, what = setting, "LIDARSEG_DEADLINE_S"
    if value is not None:
        text = value.strip()
        ms = float(text) if _MILLISECONDS.fullmatch(text) else math.nan  # inf: past any setting
        if not ms > 0:
            raise ServiceError(
                400,
                "invalid_request",
                f"{DEADLINE_HEADER}: {value[:40]!r} is no positive number of milliseconds",
            )
        if ms / 1e3 < setting:
            seconds, what = ms / 1e3, DEADLINE_HEADER
    return Deadline(time.monotonic() + seconds, f"{seconds:g} s ({what})")


def request_stream(request: Request) -> str | None:
    """The client's X-Stream-Id (a sensor's stream: a newer frame of it drops its older frames
    still queued, answered 409 superseded), or None; 400 unless 1 to 64 letters, digits or
    ._:/- , or when given twice."""
    value = one_header(request, STREAM_HEADER)
    if value is not None and not STREAM_ID.fullmatch(value):
        raise ServiceError(
            400,
            "invalid_request",
            f"{STREAM_HEADER}: {value[:40]!r} is not 1 to 64 of A-Z a-z 0-9 . _ : / -",
        )
    return value


async def wait_result(request: Request, service: ServiceState, job, deadline: Deadline):
    """The job's result; 504 past the deadline; the job is cancelled (never run if it still
    waits) when the client disconnects or the deadline passes."""
    waiter = asyncio.wrap_future(job.future)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait(
            {waiter, gone},
            timeout=max(0.0, deadline.at - time.monotonic()),
            return_when=asyncio.FIRST_COMPLETED,
        )
        if waiter in done:
            return waiter.result()
        if gone in done:
            give_up(service, job, CLIENT_GONE)
            raise ServiceError(499, "client_closed_request", "the client went away")
        raise asyncio.TimeoutError
    except Superseded as e:  # dropped from the queue by the worker already
        raise ServiceError(409, "superseded", str(e)) from None
    except (asyncio.TimeoutError, DeadlineExceeded):
        give_up(service, job, DEADLINE)
        raise ServiceError(
            504,
            "deadline_exceeded",
            f"not segmented within {deadline.budget}",
        ) from None
    finally:
        gone.cancel()
        if not waiter.done():
            waiter.cancel()


def declared_inline(request: Request, fmt: str | None) -> bool:
    """Whether the request's headers promise a body decoded inline (decodes_inline: a raw
    layout of a declared size within the limit)."""
    declared = request.headers.get("content-length", "")
    return declared.isdigit() and decodes_inline(
        fmt, request.headers.get("content-type"), int(declared)
    )


def give_up(service: ServiceState, job: Job, reason: str) -> None:
    """The route stops waiting for `job`. Not started, it never runs: out of the queue, or its
    future cancelled here and now (a forming batch drops it as it starts), and the worker counts
    it as lidarseg_dropped. Started (running or done), its answer goes nowhere:
    lidarseg_wasted_runs. A job the worker refused has its future failed already: neither."""
    if service.worker.cancel(job, reason) or job.future.cancel():
        return
    if job.started:
        service.metrics.wasted_runs.labels(reason=reason).inc()


async def _disconnected(request: Request) -> None:
    """Returns once the client has disconnected (the body is already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
