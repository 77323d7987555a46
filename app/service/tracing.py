"""OpenTelemetry traces: one span per HTTP request, a child span per stage, one shared span per
pipeline run (a batch of frames), which each frame's pipeline-stage spans link to.

Export is switched on by the standard variables only: OTEL_TRACES_EXPORTER (`otlp` or `console`),
or OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (OTLP over HTTP/protobuf);
OTEL_SDK_DISABLED=true wins. The SDK reads the rest itself (OTEL_SERVICE_NAME,
OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, OTEL_BSP_*, OTEL_EXPORTER_OTLP_HEADERS, ...).

Off (the default) no SDK object is made: the trace id is still taken from the incoming W3C
`traceparent` (or drawn at random), so the access log, the exemplars and /v1/requests carry it,
and the response still returns a `traceparent`.

Stage spans are written when the request ends, with the start and end times the route measured,
so their durations are the response's `timing_ms` values.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.trace import Span

# the stages one pipeline run times for all frames of a batch: their spans link to that run's span
from app.inference.pipeline import PIPELINE_STAGES

TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_ZERO_TRACE = "0" * 32


@dataclass
class RequestTrace:
    """The trace of one request; `span` is the SDK span when tracing is on."""

    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits: this request's span
    sampled: bool
    start_ns: int  # wall clock (epoch ns) at the start ...
    start_perf: float  # ... and time.perf_counter() at the same moment
    span: Span | None = None
    links: list = field(default_factory=list)  # span contexts of shared inference spans

    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{'01' if self.sampled else '00'}"

    def ns(self, perf: float) -> int:
        """A time.perf_counter() reading as epoch nanoseconds."""
        return self.start_ns + int((perf - self.start_perf) * 1e9)


def export_requested(environ=os.environ) -> str | None:
    """Which exporter the OTEL_* variables ask for: 'otlp', 'console' or None (off)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",")]
    names = [n for n in names if n]
    if names:
        if names == ["none"]:
            return None
        unknown = set(names) - {"otlp", "console"}
        if unknown:
            raise ValueError(
                f"OTEL_TRACES_EXPORTER: {sorted(unknown)} not supported (otlp, console, none)"
            )
        return names[0]
    if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    ):
        return "otlp"
    return None


def checked_export(environ=os.environ) -> str | None:
    """export_requested's exporter once the OTLP protocol is one this service speaks; ValueError
    naming the OTEL_* setting it cannot honour (`serve` exits 2 on it, as on bad settings)."""
    kind = export_requested(environ)
    if kind == "otlp":
        names = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
        name = next((n for n in names if n in environ), names[1])
        protocol = environ.get(name, "http/protobuf")
        if protocol != "http/protobuf":
            raise ValueError(f"{name}={protocol!r} not supported: use http/protobuf")
    return kind


def provider_from_env(environ=os.environ):
    """A TracerProvider exporting as the OTEL_* variables say, or None when they say nothing."""
    kind = checked_export(environ)
    if kind is None:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if kind == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    else:
        exporter = ConsoleSpanExporter()
    resource = Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME", "lidarseg")})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


class Tracing:
    """Starts and ends the spans of requests and pipeline runs (no-ops without a provider)."""

    def __init__(self, provider=None):
        self.provider = provider
        self.tracer = provider.get_tracer("lidarseg") if provider is not None else None

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    def start(
        self, name: str, traceparent: str | None, attributes: dict, traced: bool = True
    ) -> RequestTrace:
        """The request's trace; a span only with tracing on and `traced` (probes and scrapes are
        not: a span every few seconds from each would bury the requests in the backend)."""
        now_ns, now = time.time_ns(), time.perf_counter()
        if self.tracer is None or not traced:
            m = TRACEPARENT.match(traceparent or "")
            if m and m[1] != _ZERO_TRACE:
                return RequestTrace(m[1], os.urandom(8).hex(), bool(int(m[3], 16) & 1), now_ns, now)
            return RequestTrace(os.urandom(16).hex(), os.urandom(8).hex(), False, now_ns, now)
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = (
            TraceContextTextMapPropagator().extract({"traceparent": traceparent})
            if traceparent
            else None
        )
        span = self.tracer.start_span(
            name, parent, kind=SpanKind.SERVER, attributes=attributes, start_time=now_ns
        )
        ctx = span.get_span_context()
        return RequestTrace(
            f"{ctx.trace_id:032x}",
            f"{ctx.span_id:016x}",
            ctx.trace_flags.sampled,
            now_ns,
            now,
            span,
        )

    def finish(
        self,
        rt: RequestTrace,
        stages: list[tuple[str, float, float]],
        attributes: dict,
        status: int,
        end_perf: float,
    ) -> None:
        """Writes a child span per (stage, start perf_counter, ms) and ends the request span."""
        if rt.span is None:
            return
        from opentelemetry import trace
        from opentelemetry.trace import Link, Status, StatusCode

        parent = trace.set_span_in_context(rt.span)
        links = [Link(c) for c in rt.links]
        for name, start, ms in stages:
            t0 = rt.ns(start)
            shared = links if name in PIPELINE_STAGES else ()
            self.tracer.start_span(name, parent, start_time=t0, links=shared).end(
                t0 + round(ms * 1e6)
            )
        rt.span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        rt.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            rt.span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
        rt.span.end(rt.ns(end_perf))

    @contextlib.contextmanager
    def pipeline_run(self, traces: list[RequestTrace | None], attributes: dict):
        """The shared span of one pipeline run: a child of its first request's span, linked from
        every request of the batch."""
        if self.tracer is None:
            yield None
            return
        from opentelemetry import trace
        from opentelemetry.trace import Link

        live = [(t, t.span) for t in traces if t is not None and t.span is not None]
        parent = trace.set_span_in_context(live[0][1]) if live else None
        links = [Link(s.get_span_context()) for _, s in live[1:]]
        with self.tracer.start_as_current_span(
            "inference", parent, links=links, attributes=attributes
        ) as span:
            for t, _ in live:
                t.links.append(span.get_span_context())
            yield span

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()
