"""POST /v1/segment: one frame in (raw body, multipart file part, or JSON), one label per point out.

Before the body is read: readiness, a full queue and busy decoders are answered 503 with
Retry-After (and Connection: close). The body is read under the limits of routes/body.py.
Decoding (routes/decoding.py) runs on the decode pool, at most LIDARSEG_DECODE_CONCURRENCY at
once (beyond: 503), except a small raw float32 body, and stops at LIDARSEG_MAX_POINTS before
converting data (413). The frame then waits in the worker's
bounded queue under the request's deadline (504); a client that disconnects meanwhile has its
frame dropped unrun.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.codecs import SENSORS
from app.inference.pipeline import PIPELINE_STAGES, FrameResult
from app.service import observe
from app.service.admission import DeadlineExceeded, Job, QueueFull, WorkerStopped
from app.service.routes.body import read_body, release_body
from app.service.routes.decoding import Posted, decode_body
from app.service.routes.waiting import (
    Deadline,
    admit,
    declared_inline,
    request_deadline,
    request_stream,
    wait_result,
)
from app.service.state import ServiceError, ServiceState
from app.service.routes.deps import ApiKey, Service
from app.service.routes.multipart import one_file_part
from app.service.routes.segment_api import (
    DETAILS,
    FORMAT_MAX_LENGTH,
    PARAMETERS,
    REQUEST_BODY,
    RESPONSES,
)
from kernels.labels import labels_json
from models.labels import class_counts as count_classes

log = logging.getLogger("lidarseg")

router = APIRouter(prefix="/v1", tags=["segment"], dependencies=[ApiKey])

BINARY_TYPES = ("application/octet-stream",)
QUERY_NAMES = ("format", "detail", "sensor")  # the segment route's query parameters


def server_timing(timing_ms: dict[str, float]) -> str:
    return ", ".join(f"{k};dur={v:.3f}" for k, v in timing_ms.items())


def query_options(request: Request) -> tuple[str | None, str | None, str | None]:
    """(format, detail, sensor) from the query, checked as PARAMETERS documents them: read here
    rather than as FastAPI query parameters, whose per-request validation cost about 90 us a
    request on a Zen 1 core (bench: a POST through the app in process, 420 -> 330 us)."""
    query = request.query_params
    for name in QUERY_NAMES:  # one value each: which of two would win is no contract
        if len(query.getlist(name)) > 1:
            raise ServiceError(400, "invalid_request", f"query.{name}: given more than once")
    fmt, detail, sensor = query.get("format"), query.get("detail"), query.get("sensor")
    sensor = sensor.strip().lower() if sensor is not None else None  # as `format`: any case
    if fmt is not None and len(fmt) > FORMAT_MAX_LENGTH:
        raise ServiceError(
            400,
            "invalid_request",
            f"query.format: String should have at most {FORMAT_MAX_LENGTH} characters",
        )
    if detail is not None and detail not in DETAILS:
        wanted = " or ".join(repr(d) for d in DETAILS)
        raise ServiceError(400, "invalid_request", f"query.detail: Input should be {wanted}")
    if sensor is not None and sensor not in SENSORS:
        wanted = ", ".join(repr(s) for s in SENSORS)
        raise ServiceError(400, "invalid_request", f"query.sensor: Input should be one of {wanted}")
    return fmt, detail, sensor


def wants_binary(accept: str) -> bool:
    """Binary when application/octet-stream is acceptable (q > 0; a q that is no number: 0)
    and preferred over JSON."""
    best, best_q = None, -1.0
    for part in accept.split(","):
        media, *params = [p.strip() for p in part.split(";")]
        q = 1.0
        for p in params:
            if p.startswith("q="):
                try:
                    q = float(p[2:])
                except ValueError:
                    q = 0.0
        if media in BINARY_TYPES or media == "application/json":
            if q > max(best_q, 0.0):
                best, best_q = media, q
    return best in BINARY_TYPES


@router.post(
    "/segment",
    summary="Segment one LiDAR frame",
    responses=RESPONSES,
    response_model=None,
    openapi_extra={"requestBody": REQUEST_BODY, "parameters": PARAMETERS},
)
async def segment(request: Request, service: Service) -> Response:
    try:
        return await _segment(request, service)
    finally:
        release_body(request, service)  # the frame's body is dropped with the answer


async def _segment(request: Request, service: ServiceState) -> Response:
    t0 = time.perf_counter()
    fmt, detail, sensor = query_options(request)
    request_id = request.state.request_id
    deadline = request_deadline(request, service)  # a bad header: its 400 before a busy 503
    stream = request_stream(request)
    admit(service, declared_inline(request, fmt))
    frame = await read_frame(request, service, fmt, request_id, sensor)
    job = submit(request, service, frame, deadline, detail, stream)
    result = await wait_result(request, service, job, deadline)

    t_enc = time.perf_counter()
    timing = {
        "receive": (frame.t_body - t0) * 1e3,
        "decode": frame.decode_ms,
        "queue": job.queue_ms,
        **{k: result.timing_ms.get(k, 0.0) for k in PIPELINE_STAGES},
    }
    headers = {
        "X-Request-Id": request_id,
        "X-Model": service.model_tag,
        "X-Num-Points": str(result.num_points),
        "X-Num-Voxels": str(result.num_voxels),
        "X-Ignored-Points": str(result.ignored_points),
        "X-Cleaned-Points": str(frame.cleaned),
        "X-Sensor": frame.sensor,
        "X-Batch-Size": str(job.batch_size),
    }
    if wants_binary(request.headers.get("accept", "")):
        payload = result.labels.astype(np.uint8, copy=False).tobytes()
        timing["encode"] = (time.perf_counter() - t_enc) * 1e3
        timing["total"] = (time.perf_counter() - t0) * 1e3
        media_type = "application/octet-stream"
    else:
        payload, timing = json_payload(
            service, frame, result, job, detail, request_id, timing, t0, t_enc
        )
        media_type = "application/json"
    headers["Server-Timing"] = server_timing(timing)
    record(request, service, frame, result, job, timing, t_enc)
    return Response(payload, media_type=media_type, headers=headers)


@dataclass
class PostedFrame:
    """A request's frame as read and decoded: the body as it came, its points and when."""

    body: bytes
    content_type: str | None
    fmt: str | None
    points: np.ndarray
    sensor: str
    valid: object  # valid_mask's result (routes/decoding.py), for the pipeline
    cleaned: int  # points whose intensity or later columns were clamped or zeroed
    t_body: float  # when the whole body was in (time.perf_counter)
    decode_ms: float


async def read_frame(
    request: Request, service: ServiceState, fmt: str | None, request_id: str, sensor: str | None
) -> PostedFrame:
    """The body (a multipart file part's, where the request is multipart/form-data), decoded
    and checked; a JSON body is read as the json format unless `format` says otherwise; its
    intensities in the `sensor` convention when the query names one."""
    body = await read_body(request, service)
    t_body = time.perf_counter()
    content_type = request.headers.get("content-type")
    media = (content_type or "").split(";")[0].strip().lower()
    if media == "multipart/form-data":
        body, content_type = one_file_part(body, content_type or "")  # linear in the body
        media = (content_type or "").split(";")[0].strip().lower()
    if media == "application/json" and fmt is None:
        fmt = "json"
    decoded = await decode_body(service, Posted(body, fmt, content_type, request_id, sensor))
    decode_ms = (time.perf_counter() - t_body) * 1e3
    return PostedFrame(
        body, content_type, fmt, **decoded._asdict(), t_body=t_body, decode_ms=decode_ms
    )


def submit(
    request: Request,
    service: ServiceState,
    frame: PostedFrame,
    deadline: Deadline,
    detail: str | None,
    stream: str | None = None,
) -> Job:
    """The frame's job in the worker's queue: 503 when the queue is full or the server drains,
    504 when the work ahead already rules out the deadline."""
    try:
        job = service.worker.submit(
            frame.points,
            frame.sensor,
            deadline.at,
            layer_timing=detail == "layers",
            trace=observe.trace_of(request),
            valid=frame.valid,
            stream=stream,
        )
    except QueueFull as e:
        raise ServiceError(503, "queue_full", f"server busy: {e}", service.retry_after()) from None
    except WorkerStopped as e:
        raise ServiceError(503, "draining", str(e), service.retry_after()) from None
    except DeadlineExceeded as e:
        raise ServiceError(504, "deadline_exceeded", f"{e} ({deadline.budget})") from None
    service.metrics.queue_depth.set(service.worker.depth)
    return job


def json_payload(
    service: ServiceState,
    frame: PostedFrame,
    result: FrameResult,
    job: Job,
    detail: str | None,
    request_id: str,
    timing: dict[str, float],
    t0: float,
    t_enc: float,
) -> tuple[bytes, dict[str, float]]:
    """(the JSON response's bytes, the timing it reports: encode and total added, rounded): the
    labels as one kernel pass's text (kernels/labels.py), the rest through json."""
    labels = labels_json(result.labels)
    names = service.class_names
    class_counts = count_classes(result.labels, names)
    timing["encode"] = (time.perf_counter() - t_enc) * 1e3
    timing["total"] = (time.perf_counter() - t0) * 1e3
    timing = {k: round(v, 3) for k, v in timing.items()}
    rest = {
        "num_points": result.num_points,
        "num_voxels": result.num_voxels,
        "ignored_points": result.ignored_points,
        "cleaned_points": frame.cleaned,
        "sensor": frame.sensor,
        "classes": names,
        "class_counts": class_counts,
        "timing_ms": timing,
        "model": {
            "name": service.model_name,
            "version": service.model_version,
            "device": service.device,
        },
        "request_id": request_id,
        "batch_size": job.batch_size,
    }
    if detail == "layers":
        rest["layer_ms"] = {k: round(v, 3) for k, v in (result.layer_ms or {}).items()}
    return b'{"labels":' + labels + b"," + json.dumps(rest)[1:].encode(), timing


def record(
    request: Request,
    service: ServiceState,
    frame: PostedFrame,
    result: FrameResult,
    job: Job,
    timing: dict[str, float],
    t_enc: float,
) -> None:
    """The request in the observability records (app/service/observe.py: trace, exemplar,
    recent requests) and the stage, point and voxel histograms."""
    exemplar = observe.record(
        request,
        timing=timing,
        result=result,
        batch_size=job.batch_size,
        fmt=frame.fmt,
        body=frame.body,
        content_type=frame.content_type,
        points=frame.points,
        cleaned=frame.cleaned,
        t_body=frame.t_body,
        t_enc=t_enc,
    )
    metrics = service.metrics
    metrics.observe_stages(timing, exemplar)
    metrics.points.observe(result.num_points, exemplar)
    metrics.voxels.observe(result.num_voxels, exemplar)
    if frame.cleaned:
        metrics.cleaned.inc(frame.cleaned)
