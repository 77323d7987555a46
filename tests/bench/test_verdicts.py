"""bench.verdicts: issue 16's bars judged from the benchmarks' JSON, on made-up figures whose
verdicts are known (the unrounded median decides: x1.2549 is a FAIL though it prints x1.25)."""

from __future__ import annotations

import json

from bench.verdicts import speed_bar, verdicts

ZEN4 = ("AVX512_BF16", "AVX512_VNNI", "AVX512F", "AVX2")
XEON_AMX = ("AMX_BF16", "AMX_TILE", "AVX512_BF16", "AVX512_VNNI", "AVX2")


def _write(out, **steps) -> None:
    for name, figures in steps.items():
        (out / f"{name}.json").write_text(json.dumps(figures))


def _precision(speedup: float, agreement: float = 0.998, miou_drop: float = 0.001) -> dict:
    row = {
        "points": 100,
        "fp32": {"speedup": [1.0], "label_agreement": 1.0, "miou": 0.5},
        "int8": {
            "speedup": [speedup - 0.1, speedup, speedup + 0.1],
            "label_agreement": agreement,
            "miou": 0.5 - miou_drop,
        },
    }
    return {"cpu": {"running": "int8"}, "frames": {"kitti00": row}}


def _service(ratio: float, json_extra: float, http_ms: float) -> dict:
    row = {
        "frame": "kitti00",
        "points": 124668,
        "http_ms": http_ms,
        "http_over_network": [ratio],
        "json_minus_binary_ms": [json_extra],
    }
    return {"device": "cpu", "rows": [row]}


def _stream(p50_ms: float) -> dict:
    rows = {k: {"frames": 300, "p50_ms": p50_ms, "p90_ms": p50_ms + 20, "late_share": 0.2}
            for k in ("sequential", "stream")}  # fmt: skip
    return {"hz": 10.0, **rows}


def test_the_speed_bar_follows_the_cpu():
    assert speed_bar(XEON_AMX) == 2.5 and speed_bar(ZEN4) == 1.5 and speed_bar(("AVX2",)) is None


def test_every_item_passes_or_fails_on_its_unrounded_median(tmp_path):
    _write(
        tmp_path,
        precision=_precision(2.6),
        voxelize=[{"frame": "kitti00", "voxel": 0.1, "ratio": 1.4}],
        service=_service(1.2549, 0.8, 99.9),
        stream=_stream(100.01),
        scaling={
            "1": {"network_ms": 100.0, "layers_ms": {"a": 10.0, "b": 5.0}},
            "2": {"network_ms": 55.0, "layers_ms": {"a": 5.5, "b": 2.8}},
        },
    )
    lines = verdicts(tmp_path, ZEN4).splitlines()[1:]
    expected = ["PASS", "PASS", "PASS", "FAIL", "PASS", "PASS", "FAIL", "PASS"]
    assert [line[:4] for line in lines] == expected
    assert "x1.255" in lines[3]  # the printed figure shows why it fails
    assert lines[6].startswith("FAIL item 5 stream") and "p50 100.0 ms" in lines[6]
    assert verdicts(tmp_path, XEON_AMX).splitlines()[1].startswith("PASS item 1 speed")


def test_failures_and_missing_figures(tmp_path):
    _write(
        tmp_path,
        precision=_precision(2.4, agreement=0.994, miou_drop=0.006),
        scaling={
            "1": {"network_ms": 100.0, "layers_ms": {"a": 10.0}},
            "2": {"network_ms": 50.0, "layers_ms": {"a": 11.0}},  # a layer slower on 2 threads
        },
    )
    text = verdicts(tmp_path, XEON_AMX)
    assert "FAIL item 1 speed" in text and "FAIL item 1 int8 accuracy" in text
    assert "n/a  item 2" in text and "n/a  item 3" in text and "FAIL item 4" in text
    assert "n/a  item 5 stream" in text
    shed = {**_stream(61.0), "deadline_ms": 200.0}
    shed["stream_deadline"] = {**shed["stream"], "not_200": 7}
    shed["stream_superseding"] = {**shed["stream"], "not_200": 12, "p50_ms": 140.0}
    _write(tmp_path, stream=shed)
    text = verdicts(tmp_path, XEON_AMX)
    assert "PASS item 5 stream" in text and "X-Deadline-Ms 200: 7 of 300 frames refused" in text
    assert "X-Stream-Id: 12 of 300 frames superseded, the answered p50 140.0 ms" in text
    assert "n/a  item 1 speed" in verdicts(tmp_path, ("AVX2",))  # no bar without bf16 or AMX
