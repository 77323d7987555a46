"""app/client.py's parsers: the Server-Timing header and a sample of the /metrics page."""

from __future__ import annotations

from app.client import metric_value, server_timing


def test_server_timing_reads_dur_and_skips_other_parameters():
    header = 'voxelize;dur=3.2, maps;desc="dur of maps";dur=1.0, queue, network;dur=0'
    assert server_timing(header) == {"voxelize": 3.2, "maps": 1.0, "network": 0.0}
    assert server_timing("") == {}


def test_metric_value_reads_the_named_sample_only():
    text = "\n".join(
        [
            "# TYPE lidarseg_requests counter",
            'lidarseg_requests_total{route="/v1/segment",status="200"} 7.0',
            "lidarseg_requests_created 1.7e9",
            "lidarseg_queue_depth 2.0",
        ]
    )
    assert metric_value(text, "lidarseg_queue_depth") == 2.0
    assert metric_value(text, "lidarseg_requests_total", 'route="/v1/segment",status="200"') == 7
    assert metric_value(text, "lidarseg_requests") == 0.0  # a prefix of other names: absent
    assert metric_value(text, "lidarseg_queue") == 0.0
