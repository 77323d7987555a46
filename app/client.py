"""A small client of the service: one request (per-class counts and timing), or a load run
(--repeat N --concurrency C: latency p50/p95/p99 and throughput)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np


class ServiceClient:
    """Thread-safe: one httpx.Client per thread (connection reuse, keep-alive). `sensor`: the
    intensity convention of the frames it posts (the service's `sensor` parameter), if known;
    `deadline_ms`: each frame's deadline (X-Deadline-Ms: late frames are refused, not answered);
    `stream_id`: the sensor stream its frames belong to (X-Stream-Id: a newer frame drops the
    stream's older ones still queued, answered 409 superseded)."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        timeout: float = 120.0,
        sensor: str | None = None,
        deadline_ms: float | None = None,
        stream_id: str | None = None,
    ):
        self.url, self.timeout, self.sensor = url.rstrip("/"), timeout, sensor
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        if deadline_ms is not None:
            self.headers["X-Deadline-Ms"] = repr(float(deadline_ms))
        if stream_id is not None:
            self.headers["X-Stream-Id"] = stream_id
        self._local = threading.local()

    @property
    def http(self) -> httpx.Client:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = httpx.Client(timeout=self.timeout, headers=self.headers)
        return client

    def segment(
        self,
        body: bytes,
        fmt: str | None = None,
        binary: bool = False,
        content_type: str = "application/octet-stream",
    ) -> httpx.Response:
        params = {"format": fmt} if fmt else {}
        if self.sensor:
            params["sensor"] = self.sensor
        accept = "application/octet-stream" if binary else "application/json"
        return self.http.post(
            f"{self.url}/v1/segment",
            content=body,
            params=params,
            headers={"Content-Type": content_type, "Accept": accept},
        )

    def get(self, path: str) -> httpx.Response:
        return self.http.get(f"{self.url}{path}")


def server_timing(header: str) -> dict[str, float]:
    """'voxelize;dur=3.2, maps;dur=1.0' -> {'voxelize': 3.2, 'maps': 1.0}"""
    out = {}
    for part in header.split(","):
        name, *params = [p.strip() for p in part.split(";")]
        for p in params:
            if p.startswith("dur="):
                out[name] = float(p[4:])
    return out


def metric_value(text: str, name: str, labels: str = "") -> float:
    """The sample `name{labels}` of a Prometheus text page (GET /metrics; 0 when absent)."""
    key = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    return 0.0


def percentiles(values_ms: list[float]) -> dict[str, float | None]:
    """p50, p95, p99 in ms; None for each when no request succeeded (JSON has no NaN)."""
    a = np.asarray(values_ms)
    return {f"p{q}": float(np.percentile(a, q)) if len(a) else None for q in (50, 95, 99)}


def load_run(
    client: ServiceClient,
    body: bytes,
    fmt: str | None,
    repeat: int,
    concurrency: int,
    binary: bool = True,
) -> dict:
    """repeat requests over `concurrency` threads: latencies, statuses, throughput."""

    def one(_):
        t = time.perf_counter()
        r = client.segment(body, fmt, binary=binary)
        return (time.perf_counter() - t) * 1e3, r.status_code

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, range(repeat)))
    wall = time.perf_counter() - t0
    ok = [ms for ms, status in results if status == 200]
    statuses: dict[str, int] = {}
    for _, status in results:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    return {
        "requests": repeat,
        "concurrency": concurrency,
        "statuses": statuses,
        **{k: None if v is None else round(v, 2) for k, v in percentiles(ok).items()},
        "throughput_rps": round(len(ok) / wall, 2),
        "wall_s": round(wall, 2),
    }


def report_answer(args, r: httpx.Response) -> None:
    """Prints a 200's labels (binary) or its classes (JSON); ValueError, KeyError or TypeError
    for an answer that is not the service's (labels not one per point, fields missing)."""
    if args.binary:
        labels = np.frombuffer(r.content, np.uint8)
        if str(len(labels)) != r.headers.get("x-num-points"):
            raise ValueError(f"{len(labels)} labels, X-Num-Points {r.headers.get('x-num-points')}")
        print(
            f"{len(labels)} labels, model {r.headers.get('x-model')}, "
            f"request {r.headers.get('x-request-id')}"
        )
        return
    data = r.json()
    if len(data["labels"]) != data["num_points"]:
        raise ValueError(f"{len(data['labels'])} labels for {data['num_points']} points")
    print(
        f"frame {args.frame}: {data['num_points']} points, {data['num_voxels']} voxels, "
        f"{data['ignored_points']} ignored, {data.get('cleaned_points', 0)} cleaned; "
        f"model {data['model']['name']}:"
        f"{data['model']['version']} on {data['model']['device']}"
    )
    for name, count in sorted(data["class_counts"].items(), key=lambda t: -t[1]):
        print(f"  {name:<14} {count:>8}")


def main(args) -> int:
    """`python -m app client` (app/cli.py): args.format None lets the service infer it."""
    body = Path(args.frame).read_bytes()
    fmt = args.format
    key = args.api_key or os.environ.get("LIDARSEG_API_KEY")
    client = ServiceClient(
        args.url, key, sensor=args.sensor, deadline_ms=args.deadline_ms, stream_id=args.stream_id
    )
    try:
        if args.repeat > 1 or args.concurrency > 1:
            report = load_run(
                client, body, fmt, max(args.repeat, 1), max(args.concurrency, 1), binary=True
            )
            print(
                f"{report['requests']} requests, concurrency {report['concurrency']}: "
                f"p50 {report['p50']} ms, p95 {report['p95']} ms, p99 {report['p99']} ms, "
                f"{report['throughput_rps']} frames/s, statuses {report['statuses']}"
            )
            print(json.dumps(report))
            return 0 if set(report["statuses"]) == {"200"} else 1
        t = time.perf_counter()
        r = client.segment(body, fmt, binary=args.binary)
        rtt = (time.perf_counter() - t) * 1e3
    except httpx.HTTPError as e:
        print(f"lidarseg client: {args.url}: {e}", file=sys.stderr)
        return 1
    if r.status_code != 200:
        print(f"HTTP {r.status_code}: {r.text}", file=sys.stderr)
        return 1
    try:
        report_answer(args, r)
    except (ValueError, KeyError, TypeError) as e:  # JSON, fields, counts: not our answer
        print(f"lidarseg client: {args.url}: not a lidarseg answer ({e!r:.200})", file=sys.stderr)
        return 1
    timing = server_timing(r.headers.get("server-timing", ""))
    timing["round_trip"] = round(rtt, 3)
    print("timing_ms " + json.dumps(timing))
    return 0
