"""Per-request observability in one place: the trace (tracing.py), the exemplar, the access-log
line (access_log.py) and the ring buffer of recent requests (recent.py).

The `Observe` middleware starts the request's trace, returns its `traceparent`, and when the
response is sent hands what the route recorded (`record()`, one call at the end of the segment
route) to the tracer, the access log and the ring. Nothing here reads or keeps a header other
than `traceparent`; the ring keeps points only within its memory budget.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from app.codecs import infer_format
from app.inference.pipeline import STAGES
from app.service.access_log import AccessLog
from app.service.accounting import ERROR_KEY, SEGMENT_ROUTE
from app.service.recent import RequestRing
from app.service.tracing import RequestTrace, Tracing, provider_from_env

if TYPE_CHECKING:
    from app.service.state import ServiceState

TRACE_KEY, RECORD_KEY = "lidarseg_trace", "lidarseg_record"
UNTRACED_PATHS = frozenset(("/healthz", "/readyz", "/metrics"))  # probes and scrapes: no spans
HTTP_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"))


class Observability:
    def __init__(self, service: ServiceState, tracing: Tracing | None = None):
        settings = service.settings
        self.service = service
        self.tracing = tracing if tracing is not None else Tracing(provider_from_env())
        self.access_log = AccessLog(settings.access_log)
        self.ring = RequestRing(
            settings.dashboard_requests, int(settings.dashboard_points_mb * 1024 * 1024)
        )
        self.exemplars = settings.exemplars

    # ---- worker side -------------------------------------------------------------------------
    @property
    def on_run(self):
        """The worker's hook around one pipeline run (None when tracing is off: no cost)."""
        return self._pipeline_run if self.tracing.enabled else None

    def _pipeline_run(self, jobs):
        service = self.service
        return self.tracing.pipeline_run(
            [getattr(j, "trace", None) for j in jobs],
            {
                "lidarseg.batch_size": len(jobs),
                "lidarseg.model": service.model_tag,
                "lidarseg.device": service.device,
            },
        )

    # ---- request side ------------------------------------------------------------------------
    def done(self, scope, rt: RequestTrace, status: int, end: float) -> None:
        state = scope.get("state", {})
        rec = state.get(RECORD_KEY)
        method, path = scope["method"], scope["path"]
        if rec is not None:
            timing, info = rec["timing"], rec["info"]
        else:
            timing, info = {"total": round((end - rt.start_perf) * 1e3, 3)}, {}
        request_id = state.get("request_id")
        if state.get(ERROR_KEY) is not None:
            info = {**info, "error": state[ERROR_KEY]}
        if rt.span is not None:
            route = scope.get("route")
            if route is not None and hasattr(rt.span, "update_name"):
                rt.span.update_name(f"{method} {getattr(route, 'path', path)}")
            attrs = {f"lidarseg.{k}": v for k, v in info.items()}
            attrs.update(
                {
                    "lidarseg.request_id": request_id,
                    "lidarseg.model": self.service.model_tag or None,
                    "lidarseg.device": self.service.device,
                }
            )
            self.tracing.finish(rt, rec["stages"] if rec else [], attrs, status, end)
        client = scope.get("client")
        client = f"{client[0]}:{client[1]}" if client else None
        self.access_log.write(method, path, status, client, request_id, rt.trace_id, timing, info)
        if path == SEGMENT_ROUTE and method == "POST" and self.ring.enabled:
            if not self.ring.class_names:
                self.ring.class_names = self.service.class_names
            summary = {
                "id": request_id or rt.span_id,
                "trace_id": rt.trace_id,
                "time": rt.start_ns / 1e9,
                "status": status,
                "client": client,
                **info,
                "timing_ms": timing,
            }
            self.ring.add(summary, rec and rec["points"], rec and rec["labels"])


def record(
    request,
    *,
    timing: dict[str, float],
    result,
    batch_size: int,
    fmt: str | None,
    body: bytes,
    content_type: str | None,
    points,
    cleaned: int,
    t_body: float,
    t_enc: float,
) -> dict | None:
    """What the segment route measured, for the middleware; returns the exemplar (the trace id)
    for the route's histogram observations, or None."""
    state = request.scope.setdefault("state", {})
    rt: RequestTrace | None = state.get(TRACE_KEY)
    obs: Observability | None = getattr(request.app.state, "observe", None)
    if rt is None or obs is None:
        return None
    # the stage spans, laid end to end from where the route measured them (receive ends at t_body)
    stages, start = [], t_body - timing.get("receive", 0.0) / 1e3
    for name in STAGES:
        if name == "encode":  # after the wait for the worker's result
            start = t_enc
        ms = timing.get(name, 0.0)
        stages.append((name, start, ms))
        start += ms / 1e3
    try:
        fmt = fmt or infer_format(body, content_type)
    except Exception:  # noqa: BLE001 - only a label for the log
        fmt = None
    info = {
        "format": fmt,
        "points": result.num_points,
        "voxels": result.num_voxels,
        "ignored_points": result.ignored_points,
        "cleaned_points": cleaned,
        "batch_size": batch_size,
    }
    state[RECORD_KEY] = {
        "timing": timing,
        "info": info,
        "stages": stages,
        "points": points,
        "labels": result.labels,
    }
    # an exemplar links its trace in the backend: none for a trace the sampler left out (only
    # the access log and /v1/requests have its id); with tracing off, the id is all there is
    linked = rt.sampled or not obs.tracing.enabled
    return {"trace_id": rt.trace_id} if obs.exemplars and linked else None


def trace_of(request) -> RequestTrace | None:
    return request.scope.get("state", {}).get(TRACE_KEY)


class Observe:
    """Pure ASGI middleware: the trace of each HTTP request, then Observability.done()."""

    def __init__(self, app, observability: Observability):
        self.app, self.obs = app, observability

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        traceparent = None
        for key, value in scope["headers"]:
            if key == b"traceparent":
                traceparent = value.decode("latin-1")
                break
        method, path = scope["method"], scope["path"]
        # named by the method alone until a route matches (done() adds its template): a path or
        # method a client makes up never becomes a span name (bounded names, as Tempo keys on)
        name = method if method in HTTP_METHODS else "HTTP"
        rt = self.obs.tracing.start(
            name,
            traceparent,
            {"http.request.method": method, "url.path": path},
            traced=path not in UNTRACED_PATHS,
        )
        scope.setdefault("state", {})[TRACE_KEY] = rt
        header = (b"traceparent", rt.traceparent().encode())
        status = 500

        async def send_wrapper(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.obs.done(scope, rt, status, time.perf_counter())


def install(app, service: ServiceState, tracing: Tracing | None = None) -> Observability:
    """Adds the middleware, the dashboard routes and the local /docs; the app keeps the
    Observability at app.state.observe (and the service at service.observe)."""
    from app.service.routes import dashboard

    obs = Observability(service, tracing)
    app.state.observe = obs
    service.observe = obs
    app.add_middleware(Observe, observability=obs)
    dashboard.mount(app)
    return obs
