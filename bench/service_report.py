"""What bench/service.py prints and writes per frame: the raw samples of one frame's interleaved
runs (in-process, httpx binary and JSON, http.client, the transport floor), the table header, and
each frame's row of medians with the lines under it (service layer, pipeline stages side by side,
issue 16's two ratios, the http.client round trip against the transport floor).
"""

from __future__ import annotations

import dataclasses
import statistics

import torch

from app.inference.pipeline import PIPELINE_STAGES, STAGES


@dataclasses.dataclass
class FrameSamples:
    """One frame's runs, one entry a run (ms; stages as the pipeline or Server-Timing give them)."""

    points: int
    local_ms: list[float] = dataclasses.field(default_factory=list)
    local_stages: list[dict[str, float]] = dataclasses.field(default_factory=list)
    binary_ms: list[float] = dataclasses.field(default_factory=list)
    binary_stages: list[dict[str, float]] = dataclasses.field(default_factory=list)
    json_ms: list[float] = dataclasses.field(default_factory=list)
    json_stages: list[dict[str, float]] = dataclasses.field(default_factory=list)
    # (round trip ms, the server's stages) of the binary request through http.client
    stdlib: list[tuple[float, dict[str, float]]] = dataclasses.field(default_factory=list)
    floor_ms: list[float] = dataclasses.field(default_factory=list)


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} [{min(values):.3g}..{max(values):.3g}]"


def print_header(device: str, weights: str, precision: str, runs: int) -> None:
    print(
        f"device {device}, weights {weights}, precision {precision}, "
        f"torch threads {torch.get_num_threads()}, "
        f"median of {runs} runs, binary in and out"
    )
    print(
        f"{'frame':<11}{'points':>8}{'in-proc ms':>12}{'HTTP ms':>10}{'overhead ms':>13}"
        f"{'overhead %':>12}   server decode/queue/encode/total ms"
    )


def report_times(name: str, s: FrameSamples) -> dict:
    """The frame's row of medians (round trip vs in-process, the server's stages, the service
    layer) and its first three lines."""
    lm, rm = statistics.median(s.local_ms), statistics.median(s.binary_ms)
    srv = {k: statistics.median(st[k] for st in s.binary_stages) for k in (*STAGES, "total")}
    loc = {k: statistics.median(st[k] for st in s.local_stages) for k in PIPELINE_STAGES}
    row = {
        "frame": name,
        "points": s.points,
        "in_process_ms": round(lm, 2),
        "http_ms": round(rm, 2),
        "overhead_ms": round(rm - lm, 2),
        "overhead_pct": round(100 * (rm - lm) / rm, 1),
        "server_ms": {k: round(v, 2) for k, v in srv.items()},
        "in_process_stages_ms": {k: round(v, 2) for k, v in loc.items()},
    }
    print(
        f"{name:<11}{s.points:>8}{lm:>12.1f}{rm:>10.1f}{rm - lm:>13.1f}"
        f"{row['overhead_pct']:>11.1f}%   "
        + " / ".join(f"{srv[k]:.1f}" for k in ("decode", "queue", "encode", "total"))
    )
    service_ms = rm - sum(srv[k] for k in loc)  # HTTP + decode + queue + encode
    row["service_layer_ms"] = round(service_ms, 2)
    print(
        f"{'':<11}service layer (HTTP round trip - server pipeline stages): "
        f"{service_ms:.1f} ms = {100 * service_ms / rm:.1f}%"
    )
    print(
        f"{'':<11}pipeline stages in-proc / server in-proc / server: "
        + ", ".join(f"{k} {loc[k]:.1f}/{srv[k]:.1f}" for k in loc)
    )
    return row


def report_ratios(row: dict, s: FrameSamples, json_pairs_ms: list[float]) -> None:
    """Adds the per-request samples to the frame's row and prints its last two lines: the
    http.client round trip against the transport floor, and issue 16's ratios (HTTP total
    (binary) / that request's network stage, and a JSON response's round trip minus the binary
    one of the same run (they take turns going first), the runs' and then `json_pairs_ms`, the
    extra pairs')."""
    per_net = [r / st["network"] for r, st in zip(s.binary_ms, s.binary_stages)]
    json_extra = [j - b for j, b in zip(s.json_ms, s.binary_ms)]
    json_extra += json_pairs_ms
    enc = [st["encode"] for st in s.json_stages]
    row.update(http_over_network=per_net, json_minus_binary_ms=json_extra, json_encode_ms=enc)
    lean_ratio = [ms / st["network"] for ms, st in s.stdlib]
    lean_layer = [ms - sum(st[k] for k in PIPELINE_STAGES) for ms, st in s.stdlib]
    row["stdlib_http_ms"] = [ms for ms, _ in s.stdlib]
    row["stdlib_http_over_network"] = lean_ratio
    row.update(stdlib_service_layer_ms=lean_layer, transport_floor_ms=s.floor_ms)
    print(
        f"{'':<11}the same with Python's http.client as the client: HTTP "
        f"{statistics.median(ms for ms, _ in s.stdlib):.1f} ms, / network stage "
        f"x{_spread(lean_ratio)}; service layer {_spread(lean_layer)} ms against "
        f"the transport floor {_spread(s.floor_ms)} ms"
    )
    print(
        f"{'':<11}HTTP total (binary) / network stage: x{_spread(per_net)}; "
        f"JSON - binary round trip: {_spread(json_extra)} ms "
        f"(server JSON encode {_spread(enc)} ms)"
    )
