"""HTTP round trip vs the in-process pipeline on the same frames, side by side.

    python -m bench.service [--frames kitti00 nuscenes ouster128] [--weights default]
                            [--cr 1.0] [--device cpu] [--runs 7] [--precision auto]
                            [--url URL] [--json OUT]

Starts `python -m app serve` on a loopback port (unless --url points at a running one, which must
serve the same model), posts each frame as raw binary asking for binary labels
(application/octet-stream both ways), and times the same frame through SegmentationPipeline in
this process. The two are timed one after the other, never at once (they share the cores).
Overhead = HTTP round trip - in-process wall time, and its share of the round trip; the server's
own decode / queue / encode stages (Server-Timing) say where it goes. On a loaded machine the
pipeline itself varies more than the overhead: "service layer" (round trip minus the server's
own pipeline stages) isolates what HTTP, decoding, queueing and encoding cost. Each run also posts
the frame asking for JSON; per run it prints HTTP total (binary) / the server's network stage of
the same request, and JSON round trip - binary round trip (issue 16's two ratios), the latter
over the runs plus --json-pairs more (binary, JSON) pairs. The client is httpx (what app/client.py
uses); each run also posts the binary frame through Python's http.client on a keep-alive
connection of its own, a leaner client, and prints that round trip and its ratio too: the gap
between the two is the client's, not the service's. Beside each run, the same bytes (the frame
out, one byte a point back) go through a bare asyncio responder with that client
(bench/transport.py): the transport floor under the service layer.
"""

from __future__ import annotations

import argparse
import gc
from http.client import HTTPConnection
import json
import signal
import statistics
import time
import urllib.parse

from app.heap import configure_malloc
from app.threads import configure_env

# Before torch loads libgomp and before any thread starts: the in-process pipeline runs under
# the server's settings. Its OpenMP waits passively (spinning threads left over from it would
# take the server's cores), and glibc's heap is set as the server's is (app/heap.py).
configure_env()
configure_malloc()

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from app.client import server_timing  # noqa: E402
from app.inference.builder import build_pipeline  # noqa: E402
from app.inference.pipeline import PIPELINE_STAGES, STAGES  # noqa: E402
from bench import common  # noqa: E402
from bench.transport import floor_round_trips, floor_server  # noqa: E402

# what the server's codec reports for the raw format: a raw kitti-layout body is sensor "kitti"
# (the wire carries no intensity convention), so the Ouster frame runs as "kitti" on both sides
SENSOR = {"nuscenes": "nuscenes"}
FORMAT = {"nuscenes": "nuscenes"}
BINARY = {"Content-Type": "application/octet-stream", "Accept": "application/octet-stream"}


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} [{min(values):.3g}..{max(values):.3g}]"


def json_pairs(remote, pairs: int) -> list[float]:
    """JSON round trip - binary round trip (ms) of `pairs` back-to-back pairs of the same frame,
    the order flipped every other pair so drift within a pair cancels."""
    diffs = []
    for i in range(pairs):
        ms = {}
        for accept in ("application/octet-stream", "application/json")[:: 1 if i % 2 else -1]:
            t = time.perf_counter()
            remote(accept)
            ms[accept] = (time.perf_counter() - t) * 1e3
        diffs.append(ms["application/json"] - ms["application/octet-stream"])
    return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--frames", nargs="+", default=list(common.DEFAULT_FRAMES))
    ap.add_argument("--weights", default="default", help="default, random (with --cr) or a path")
    ap.add_argument("--cr", type=float, default=1.0, help="channel ratio of --weights random")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument(
        "--precision",
        default="auto",
        help="CPU precision of the server (LIDARSEG_PRECISION) and of the in-process pipeline",
    )
    ap.add_argument("--url", default=None)
    ap.add_argument(
        "--json-pairs",
        type=int,
        default=20,
        help="more (binary, JSON) request pairs per frame for the JSON - binary figure",
    )
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--observe",
        action="store_true",
        help="instead: tracing, exemplars, access log and request ring on vs off "
        "(bench/observe.py), per request and end to end",
    )
    args = ap.parse_args(argv)
    if args.observe:
        from bench import observe

        return observe.service_main(args)

    proc, url = (
        (None, args.url)
        if args.url
        else common.start_server(
            args.weights, args.cr, args.device, env={"LIDARSEG_PRECISION": args.precision}
        )
    )
    pipeline = build_pipeline(args.weights, args.device, args.cr, precision=args.precision)
    rows = []
    floor_proc = None
    try:
        floor_proc, floor_port = floor_server()
        parts = urllib.parse.urlsplit(url)
        with httpx.Client(base_url=url, timeout=300) as http:
            print(
                f"device {args.device}, weights {args.weights}, precision {pipeline.precision}, "
                f"torch threads {torch.get_num_threads()}, "
                f"median of {args.runs} runs, binary in and out"
            )
            print(
                f"{'frame':<11}{'points':>8}{'in-proc ms':>12}{'HTTP ms':>10}{'overhead ms':>13}"
                f"{'overhead %':>12}   server decode/queue/encode/total ms"
            )
            for name in args.frames:
                frame = common.load_frame(name)
                points = np.ascontiguousarray(frame.points)
                sensor = SENSOR.get(name, "kitti")
                body = points.tobytes()
                fmt = FORMAT.get(name, "kitti")

                local_stages = []

                def local():
                    result = pipeline.segment(points, sensor)
                    local_stages.append(result.timing_ms)
                    return result.labels

                def remote(accept="application/octet-stream"):
                    r = http.post(
                        f"/v1/segment?format={fmt}",
                        content=body,
                        headers={"Content-Type": "application/octet-stream", "Accept": accept},
                    )
                    r.raise_for_status()
                    return r

                def remote_stdlib() -> tuple[float, dict[str, float]]:
                    """(round trip ms, the server's stages) of the binary request through
                    Python's http.client on its own keep-alive connection: the same request
                    with a leaner client than httpx."""
                    t = time.perf_counter()
                    lean.request("POST", f"/v1/segment?format={fmt}", body=body, headers=BINARY)
                    r = lean.getresponse()
                    r.read()
                    ms = (time.perf_counter() - t) * 1e3
                    return ms, server_timing(r.getheader("server-timing", ""))

                local_ms, remote_ms, stages, json_ms, json_stages = [], [], [], [], []
                stdlib, floor = [], []
                labels = local()  # warm-up
                # new keep-alive connections per frame: the server closes idle ones after
                # LIDARSEG_IDLE_TIMEOUT_S (5 s), shorter than a slow CPU's warm-up
                lean = HTTPConnection(parts.hostname, parts.port, timeout=300)
                bare = HTTPConnection("127.0.0.1", floor_port, timeout=60)
                floor_round_trips(bare, body, len(points), 3)  # warm-up
                gc.collect()
                gc.freeze()  # as the server does after its warm-up (app/service/main.py)
                r = remote()
                assert np.array_equal(np.frombuffer(r.content, np.uint8), labels), name
                for _ in range(args.runs):  # interleaved: drift hits both alike
                    common.sync(args.device)
                    t = time.perf_counter()
                    local()
                    common.sync(args.device)
                    local_ms.append((time.perf_counter() - t) * 1e3)
                    t = time.perf_counter()
                    r = remote()
                    remote_ms.append((time.perf_counter() - t) * 1e3)
                    stages.append(server_timing(r.headers["server-timing"]))
                    t = time.perf_counter()
                    rj = remote("application/json")
                    json_ms.append((time.perf_counter() - t) * 1e3)
                    json_stages.append(server_timing(rj.headers["server-timing"]))
                    stdlib.append(remote_stdlib())
                    floor += floor_round_trips(bare, body, len(points), 1)
                lm, rm = statistics.median(local_ms), statistics.median(remote_ms)
                srv = {k: statistics.median(s[k] for s in stages) for k in (*STAGES, "total")}
                loc = {
                    k: statistics.median(s[k] for s in local_stages[1:]) for k in PIPELINE_STAGES
                }
                row = {
                    "frame": name,
                    "points": len(points),
                    "in_process_ms": round(lm, 2),
                    "http_ms": round(rm, 2),
                    "overhead_ms": round(rm - lm, 2),
                    "overhead_pct": round(100 * (rm - lm) / rm, 1),
                    "server_ms": {k: round(v, 2) for k, v in srv.items()},
                    "in_process_stages_ms": {k: round(v, 2) for k, v in loc.items()},
                }
                rows.append(row)
                print(
                    f"{name:<11}{len(points):>8}{lm:>12.1f}{rm:>10.1f}{rm - lm:>13.1f}"
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
                # issue 16's ratios, per request: HTTP total (binary) / that request's network
                # stage, and a JSON response's round trip minus the binary one before it
                per_net = [r / s["network"] for r, s in zip(remote_ms, stages)]
                json_extra = [j - b for j, b in zip(json_ms, remote_ms)]
                json_extra += json_pairs(remote, args.json_pairs)
                enc = [s["encode"] for s in json_stages]
                row.update(
                    http_over_network=per_net, json_minus_binary_ms=json_extra, json_encode_ms=enc
                )
                lean_ratio = [ms / st["network"] for ms, st in stdlib]
                lean_layer = [ms - sum(st[k] for k in loc) for ms, st in stdlib]
                row["stdlib_http_ms"] = [ms for ms, _ in stdlib]
                row["stdlib_http_over_network"] = lean_ratio
                row.update(stdlib_service_layer_ms=lean_layer, transport_floor_ms=floor)
                print(
                    f"{'':<11}the same with Python's http.client as the client: HTTP "
                    f"{statistics.median(ms for ms, _ in stdlib):.1f} ms, / network stage "
                    f"x{_spread(lean_ratio)}; service layer {_spread(lean_layer)} ms against "
                    f"the transport floor {_spread(floor)} ms"
                )
                print(
                    f"{'':<11}HTTP total (binary) / network stage: x{_spread(per_net)}; "
                    f"JSON - binary round trip: {_spread(json_extra)} ms "
                    f"(server JSON encode {_spread(enc)} ms)"
                )
    finally:
        if floor_proc is not None:
            floor_proc.terminate()
            floor_proc.wait(10)
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": args.device,
                    "weights": args.weights,
                    "cr": args.cr,
                    "runs": args.runs,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
