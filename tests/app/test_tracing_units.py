"""app/service/tracing.py without a server: an all-zero incoming trace id, the error status of
5xx spans, and the OTLP protocols the service refuses."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from app.service.tracing import Tracing, checked_export

SPAN = "b7ad6b7169203331"


def test_an_all_zero_trace_id_is_not_taken_over():
    """W3C: an all-zero trace id is invalid; the request gets an id of its own."""
    zero = f"00-{'0' * 32}-{SPAN}-01"
    rt = Tracing(None).start("GET", zero, {})
    assert rt.trace_id != "0" * 32 and len(rt.trace_id) == 32 and not rt.sampled
    good = f"00-{'a' * 32}-{SPAN}-01"
    assert Tracing(None).start("GET", good, {}).trace_id == "a" * 32


@pytest.mark.parametrize("status,error", [(499, False), (500, True), (503, True), (504, True)])
def test_a_5xx_answer_marks_its_span_as_an_error(status, error):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider)
    rt = tracing.start("POST", None, {})
    tracing.finish(rt, [], {}, status, time.perf_counter())
    (span,) = exporter.get_finished_spans()
    assert span.attributes["http.response.status_code"] == status
    assert (span.status.status_code is StatusCode.ERROR) == error
    if error:
        assert span.status.description == f"HTTP {status}"


def test_only_otlp_over_http_protobuf_is_accepted():
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert checked_export(endpoint) == "otlp"
    for protocol in ("grpc", "http/json"):
        with pytest.raises(ValueError, match="not supported: use http/protobuf"):
            checked_export({**endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol})
    # the traces' own setting wins over the general one, either way
    both = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}  # fmt: skip
    assert checked_export({**endpoint, **both}) == "otlp"
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        checked_export(
            {
                **endpoint,
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            }  # fmt: skip
        )
    assert checked_export({}) is None  # no export: no protocol to check
