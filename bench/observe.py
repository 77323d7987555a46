"""What tracing, exemplars, the access log and the request ring cost per request, on versus off.

    python -m bench.observe [--frame kitti00] [--requests 200] [--rounds 15]

One 125k-point KITTI frame (its real points, and labels from the default model) goes through
the service's per-request observability path as the server runs it: the Observe middleware
around a stand-in route that calls observe.record(), the histogram observations and the
worker's pipeline-run hook. Only the model is left out, so the difference is the features'
own cost, measured to the microsecond, which a round trip (seconds of network on a shared
CPU) could not resolve. Configurations, interleaved round by round:

  none  no Observe middleware at all
  off   the middleware with every feature off (the default when no OTEL_* variable is set,
        minus the access log and the ring)
  trace, exemplars, log, ring: one feature on
  on    everything on: traces exported over OTLP/HTTP (BatchSpanProcessor) to a sink in another
        process, exemplars, the JSON access log (to /dev/null), the ring keeping points

CPU time is process time (all threads, so the span exporter's thread counts), after a flush of
the spans at the end of each round. `python -m bench.service --observe` prints this table too.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
import uuid

import numpy as np
from starlette.requests import Request

from app.service import observe
from app.service.access_log import AccessLog
from app.service.config import Settings
from app.service.metrics import Metrics
from app.service.routes.deps import ServiceState
from app.inference.pipeline import PIPELINE_STAGES
from app.service.tracing import Tracing
from bench import common

SINK = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""
TIMING = {
    "decode": 5.0,
    "queue": 0.1,
    "voxelize": 40.0,
    "maps": 20.0,
    "network": 300.0,
    "devoxelize": 5.0,
    "encode": 0.1,
    "total": 370.2,
}


class FakeResult:
    def __init__(self, labels):
        self.labels, self.num_points = labels, len(labels)
        self.num_voxels, self.ignored_points = 90_000, 0


CONFIGS = {
    "none": (),
    "off": (),
    "trace": ("trace",),
    "exemplars": ("exemplars",),
    "log": ("log",),
    "ring": ("ring",),
    "on": ("trace", "exemplars", "log", "ring"),
}


def build(config: str, sink_port: int):
    """(service, Observability or None, TracerProvider or None) for one configuration."""
    features = CONFIGS[config]
    settings = Settings(
        weights="random",
        access_log="json" if "log" in features else "off",
        exemplars="exemplars" in features,
        dashboard_requests=200 if "ring" in features else 0,
    )
    service = ServiceState(settings, Metrics())
    service.model_name, service.model_version, service.device = "minkunet", "bench", "cpu"
    service.class_names = [f"c{i}" for i in range(19)]
    provider = None
    if "trace" in features:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider()
        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{sink_port}/v1/traces"))
        )
    obs = observe.Observability(service, Tracing(provider))
    if "log" in features:
        obs.access_log = AccessLog("json", stream=open("/dev/null", "w"))  # noqa: SIM115
    return service, (obs if config != "none" else None), provider


def route(service, obs, points, labels, body):
    result = FakeResult(labels)

    async def app(scope, receive, send):
        request = Request(scope)
        request.state.request_id = uuid.uuid4().hex
        t = time.perf_counter()
        exemplar = None
        if obs is not None:
            hook = obs.on_run
            if hook is not None:
                with hook([type("Job", (), {"trace": observe.trace_of(request)})()]):
                    pass
            exemplar = observe.record(
                request,
                timing=dict(TIMING),
                result=result,
                batch_size=1,
                fmt="kitti",
                body=body,
                content_type="application/octet-stream",
                points=points,
                t_body=t,
                t_enc=t,
            )
        m = service.metrics
        m.observe_stages(TIMING, exemplar)
        m.points.observe(result.num_points, exemplar)
        m.voxels.observe(result.num_voxels, exemplar)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return app


async def one_round(app, fake_app, n: int, provider) -> tuple[float, float]:
    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(_message):
        pass

    headers = [(b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")]
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/segment",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "app": fake_app,
            "query_string": b"",
        }
        await app(scope, receive, send)
    if provider is not None:
        provider.force_flush()
    return ((time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6)


def measure(frame: str, n: int, rounds: int) -> dict:
    points = np.ascontiguousarray(common.load_frame(frame).points)
    labels = np.random.default_rng(0).integers(0, 19, len(points)).astype(np.uint8)
    body = points.tobytes()[:4096]  # record() only sniffs the format from the first bytes
    sink, port = start_sink()
    try:
        apps = {}
        for config in CONFIGS:
            service, obs, provider = build(config, port)
            inner = route(service, obs, points, labels, body)
            app = observe.Observe(inner, obs) if obs is not None else inner
            fake_app = type("App", (), {"state": type("S", (), {"observe": obs})()})()
            apps[config] = (app, fake_app, provider)
        samples = {c: ([], []) for c in apps}
        for r in range(rounds + 1):  # round 0 warms up
            for config, (app, fake_app, provider) in apps.items():
                wall, cpu = asyncio.run(one_round(app, fake_app, n, provider))
                if r:
                    samples[config][0].append(wall)
                    samples[config][1].append(cpu)
        for _, _, provider in apps.values():
            if provider is not None:
                provider.shutdown()
    finally:
        sink.terminate()
        sink.wait(10)
    return {
        "points": len(points),
        "requests_per_round": n,
        "rounds": rounds,
        **{
            c: {
                "wall_us": round(statistics.median(w), 1),
                "cpu_us": round(statistics.median(cp), 1),
            }
            for c, (w, cp) in samples.items()
        },
    }


def report(res: dict) -> None:
    print(
        f"observability per request, {res['points']} points, median of {res['rounds']} rounds "
        f"x {res['requests_per_round']} requests (interleaved)"
    )
    print(f"{'config':<10}{'wall us':>10}{'cpu us':>10}")
    for c in CONFIGS:
        extra = (
            f"   {res[c]['cpu_us'] - res['off']['cpu_us']:+.1f} us CPU vs off"
            if c not in ("none", "off")
            else ""
        )
        print(f"{c:<10}{res[c]['wall_us']:>10.1f}{res[c]['cpu_us']:>10.1f}{extra}")
    on_off = res["on"]["cpu_us"] - res["off"]["cpu_us"]
    off_none = res["off"]["cpu_us"] - res["none"]["cpu_us"]
    print(
        f"on - off: {on_off:.1f} us CPU per request ({on_off / 1e3:.3f} ms; budget 1 ms); "
        f"off - none: {off_none:.1f} us"
    )


def start_sink() -> tuple[subprocess.Popen, int]:
    sink = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    return sink, int(sink.stdout.readline())


def end_to_end(weights: str, cr: float, device: str, frame: str, runs: int) -> dict:
    """Two servers, every feature off / on, the same frame posted to each in turn. Service layer
    = round trip - the server's own pipeline stages (what HTTP, decode, queue, encode and the
    features cost). On a shared CPU its spread is far above 1 ms: see measure() for the cost."""
    import httpx

    from app.client import server_timing

    sink, port = start_sink()
    off = {
        "LIDARSEG_ACCESS_LOG": "off",
        "LIDARSEG_EXEMPLARS": "false",
        "LIDARSEG_DASHBOARD_REQUESTS": "0",
    }
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "LIDARSEG_ACCESS_LOG": "json"}
    servers = {}
    try:
        for name, env in (("off", off), ("on", on)):
            servers[name] = common.start_server(weights, cr, device, env, stderr=subprocess.DEVNULL)
        body = np.ascontiguousarray(common.load_frame(frame).points).tobytes()
        layer = {"off": [], "on": []}
        with httpx.Client(timeout=600) as http:
            for i in range(runs + 1):  # run 0 warms up
                for name, (_, url) in servers.items():
                    t = time.perf_counter()
                    r = http.post(
                        f"{url}/v1/segment?format=kitti",
                        content=body,
                        headers={
                            "Content-Type": "application/octet-stream",
                            "Accept": "application/octet-stream",
                        },
                    )
                    rt = (time.perf_counter() - t) * 1e3
                    r.raise_for_status()
                    st = server_timing(r.headers["server-timing"])
                    if i:
                        layer[name].append(rt - sum(st[k] for k in PIPELINE_STAGES))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(60)
        sink.terminate()
        sink.wait(10)
    return {
        k: {
            "median_ms": round(statistics.median(v), 2),
            "min_ms": round(min(v), 2),
            "max_ms": round(max(v), 2),
        }
        for k, v in layer.items()
    }


def service_main(args) -> int:
    """bench.service --observe: the per-request cost, then the end-to-end comparison."""
    frame = args.frames[0] if args.frames else "kitti00"
    report(measure(frame, 200, 15))
    e2e = end_to_end(args.weights, args.cr, args.device, frame, args.runs)
    print(
        f"end to end, {frame}, {args.runs} runs per server, service layer (round trip - "
        "server pipeline stages):"
    )
    for k, v in e2e.items():
        print(
            f"  {k:<4} median {v['median_ms']:.2f} ms  (min {v['min_ms']:.2f}, "
            f"max {v['max_ms']:.2f})"
        )
    print(f"  on - off (medians): {e2e['on']['median_ms'] - e2e['off']['median_ms']:+.2f} ms")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--frame", default="kitti00")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    report(measure(args.frame, args.requests, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
