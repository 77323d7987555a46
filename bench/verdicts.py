"""Issue 16's bars, judged from the JSON the benchmarks of bench.sensor_rate write: one line per
item, PASS, FAIL or n/a, with the figure compared (medians, unrounded) and the bar.

A figure printed to three digits can round across a bar (x1.2549 prints as x1.25): the verdict
compares the unrounded median and prints four digits. Items whose benchmark did not run or wrote
no JSON are 'n/a'. Item 1's speed bar depends on the CPU: 2.5x where it has AMX, 1.5x where it
has AVX512_BF16 without AMX, none otherwise (n/a).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path

HTTP_OVER_NETWORK_MAX = 1.25  # item 3
JSON_EXTRA_MAX_MS = 3.0  # item 3
VOXELIZE_OVER_FLOOR_MAX = 2.0  # item 2
THREAD_SPEEDUP_MIN = 1.7  # item 4
FRAME_MS_MAX = 100.0  # item 5
AGREEMENT_MIN = 0.995  # item 1
MIOU_DROP_MAX = 0.005  # item 1


def speed_bar(features: Sequence[str]) -> float | None:
    if any(f.startswith("AMX") for f in features):
        return 2.5
    return 1.5 if "AVX512_BF16" in features else None


def _load(out: Path, step: str) -> dict | None:
    try:
        return json.loads((out / f"{step}.json").read_text())
    except (OSError, ValueError):
        return None


def _line(item: str, passed: bool | None, text: str) -> str:
    word = "n/a " if passed is None else "PASS" if passed else "FAIL"
    return f"{word} item {item}: {text}"


def precision_lines(report: dict | None, features: Sequence[str]) -> list[str]:
    if report is None:
        return [_line("1", None, "bench.precision wrote no JSON")]
    running = report["cpu"]["running"]
    frames = report["frames"]
    bar = speed_bar(features)
    speed = {f: statistics.median(row[running]["speedup"]) for f, row in frames.items()}
    shown = ", ".join(f"{f} x{v:.4g}" for f, v in speed.items())
    if bar is None or running == "fp32":
        lines = [_line("1 speed", None, f"{running} against fp32: {shown} (no bar for this CPU)")]
    else:
        ok = all(v >= bar for v in speed.values())
        lines = [_line("1 speed", ok, f"{running} against fp32: {shown} (bar x{bar})")]
    for name in sorted({n for row in frames.values() for n in row if n not in ("points", "fp32")}):
        agree = {f: row[name]["label_agreement"] for f, row in frames.items() if name in row}
        drops = {
            f: row["fp32"]["miou"] - row[name]["miou"]
            for f, row in frames.items()
            if name in row and "miou" in row[name]
        }
        ok = all(a >= AGREEMENT_MIN for a in agree.values())
        ok = ok and all(d <= MIOU_DROP_MAX for d in drops.values())
        text = ", ".join(f"{f} {a * 100:.3f} %" for f, a in agree.items())
        text += "; mIoU drop " + ", ".join(f"{f} {d:+.4f}" for f, d in drops.items())
        lines.append(_line(f"1 {name} accuracy", ok, text + f" (bars {AGREEMENT_MIN:.1%}, "
                                                              f"{MIOU_DROP_MAX})"))  # fmt: skip
    return lines


def voxelize_lines(rows: list | None) -> list[str]:
    if not rows:
        return [_line("2", None, "bench.voxelize wrote no JSON")]
    ok = all(r["ratio"] <= VOXELIZE_OVER_FLOOR_MAX for r in rows)
    text = ", ".join(f"{r['frame']} {r['voxel']} m x{r['ratio']:.4g}" for r in rows)
    return [_line("2", ok, f"voxelize / numpy floor: {text} (bar x{VOXELIZE_OVER_FLOOR_MAX})")]


def service_lines(report: dict | None) -> list[str]:
    if report is None or not report.get("rows"):
        return [_line(item, None, "bench.service wrote no JSON") for item in ("3", "5")]
    row = report["rows"][0]
    ratio = statistics.median(row["http_over_network"])
    extra = statistics.median(row["json_minus_binary_ms"])
    frame = f"{row['frame']} ({row['points']} points, device {report['device']})"
    return [
        _line("3 HTTP", ratio <= HTTP_OVER_NETWORK_MAX,
              f"{frame}: HTTP total / network stage x{ratio:.4g} "
              f"(bar x{HTTP_OVER_NETWORK_MAX})"),
        _line("3 JSON", extra <= JSON_EXTRA_MAX_MS,
              f"JSON - binary round trip {extra:.3f} ms (bar {JSON_EXTRA_MAX_MS} ms)"),
        _line("5", row["http_ms"] <= FRAME_MS_MAX,
              f"{frame}: {row['http_ms']:.1f} ms a frame over HTTP (bar {FRAME_MS_MAX} ms)"),
    ]  # fmt: skip


def stream_lines(report: dict | None) -> list[str]:
    if not report:
        return [_line("5 stream", None, "bench.stream wrote no JSON")]
    s, alone = report["stream"], report["sequential"]
    lines = [
        _line("5 stream", s["p50_ms"] <= FRAME_MS_MAX,
              f"posted at {report['hz']:g} Hz, {s['frames']} frames: p50 {s['p50_ms']:.1f} ms, "
              f"p90 {s['p90_ms']:.1f}, {s['late_share']:.1%} later than a period "
              f"(one at a time: p50 {alone['p50_ms']:.1f}; bar p50 {FRAME_MS_MAX} ms)")
    ]  # fmt: skip
    shed = report.get("stream_deadline")
    if shed:  # what a client's deadline makes of the same stream: no bar, the trade it shows
        lines.append(
            f"     (with X-Deadline-Ms {report['deadline_ms']:g}: {shed['not_200']} of "
            f"{shed['frames']} frames refused, the answered p50 {shed['p50_ms']:.1f} ms, p90 "
            f"{shed['p90_ms']:.1f})"
        )
    newest = report.get("stream_superseding")
    if newest:  # X-Stream-Id: the server works on the newest scan; no bar either
        lines.append(
            f"     (with X-Stream-Id: {newest['not_200']} of {newest['frames']} frames "
            f"superseded, the answered p50 {newest['p50_ms']:.1f} ms, p90 {newest['p90_ms']:.1f})"
        )
    return lines


def scaling_lines(report: dict | None) -> list[str]:
    if not report:
        return [_line("4", None, "bench.scaling wrote no JSON")]
    counts = sorted(report, key=int)
    one, most = report[counts[0]], report[counts[-1]]
    speedup = one["network_ms"] / most["network_ms"]
    layers = one["layers_ms"]
    slower = [k for k in layers if most["layers_ms"].get(k) and layers[k] < most["layers_ms"][k]]
    ok = speedup >= THREAD_SPEEDUP_MIN and not slower
    return [
        _line("4", ok, f"network stage {counts[0]} -> {counts[-1]} threads x{speedup:.4g} "
                       f"(bar x{THREAD_SPEEDUP_MIN}); layers not faster: {len(slower)} of "
                       f"{len(layers)} (bar 0)")
    ]  # fmt: skip


def verdicts(out: Path, features: Sequence[str]) -> str:
    """The verdict block of a sensor_rate output folder."""
    lines = [
        *precision_lines(_load(out, "precision"), features),
        *voxelize_lines(_load(out, "voxelize")),  # type: ignore[arg-type]
        *service_lines(_load(out, "service")),
        *stream_lines(_load(out, "stream")),
        *scaling_lines(_load(out, "scaling")),
    ]
    return "## verdicts (issue 16's bars, unrounded medians)\n" + "\n".join(lines) + "\n"
