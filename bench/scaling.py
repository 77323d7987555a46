"""Thread scaling of the network stage, layer by layer: 1 thread against 2, side by side.

    python -m bench.scaling [--frame kitti00] [--weights random --cr 1.0] [--precision fp32]
                            [--threads 1 2] [--runs 5] [--json OUT]

One real frame goes through the pipeline (maps built by the maps stage, as the service does),
with the service's OpenMP settings (app.threads.configure_env, before libgomp loads), twice a
run: as the service runs it (the network stage's time) and with every leaf layer timed
(app.inference.clocks.layer_clock: call by call, no deferred work), the thread counts taking
turns run by run (interleaved, so a noisy machine hits them alike). Printed: the network stage's
median per thread count and its speed-up, then every layer whose median is not faster on the
most threads than on one (the ones that do not scale), and the layers that take the most time
with their speed-ups.
"""

from __future__ import annotations

from app.threads import configure_env

configure_env()  # as `python -m app` does: passive OpenMP, threads from the CPU quota

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from app.argtypes import positive_int  # noqa: E402
from app.inference.builder import build_pipeline  # noqa: E402
from bench import common  # noqa: E402


def network_run(pipeline, points, sensor) -> tuple[float, dict[str, float]]:
    """(network stage ms as the service runs it, per-layer ms of a timed run) of one run."""
    stage = pipeline.run([points], sensor)[0].timing_ms["network"]
    timed = pipeline.run([points], sensor, layer_timing=True)[0]
    return stage, dict(timed.layer_ms or {})


def measure(pipeline, points, sensor, threads: list[int], runs: int) -> dict:
    per: dict[int, dict] = {n: {"network": [], "layers": {}} for n in threads}
    for n in threads:  # warm-up at every thread count (OpenMP pools, workspaces)
        common.set_threads(n)
        network_run(pipeline, points, sensor)
    for _ in range(runs):
        for n in threads:
            common.set_threads(n)
            net, layers = network_run(pipeline, points, sensor)
            per[n]["network"].append(net)
            for name, ms in layers.items():
                per[n]["layers"].setdefault(name, []).append(ms)
    return {
        n: {
            "network_ms": statistics.median(v["network"]),
            "layers_ms": {k: statistics.median(t) for k, t in v["layers"].items()},
        }
        for n, v in per.items()
    }


def report(result: dict, threads: list[int], top: int) -> None:
    one, most = threads[0], threads[-1]
    base, best = result[one], result[most]
    print(
        f"network stage: {one} thread(s) {base['network_ms']:.1f} ms, {most} threads "
        f"{best['network_ms']:.1f} ms: {base['network_ms'] / best['network_ms']:.2f}x"
    )
    layers = base["layers_ms"]
    ratio = {k: layers[k] / best["layers_ms"][k] for k in layers if best["layers_ms"].get(k)}
    slower = [k for k, r in ratio.items() if r < 1.0]
    print(f"layers not faster on {most} threads: {len(slower)} of {len(ratio)}")
    for k in sorted(slower, key=lambda k: ratio[k]):
        print(f"  {k:40s} {layers[k]:8.2f} ms -> {best['layers_ms'][k]:8.2f} ms  {ratio[k]:.2f}x")
    print(f"the {top} slowest layers on {one} thread(s):")
    for k in sorted(layers, key=layers.get, reverse=True)[:top]:
        print(f"  {k:40s} {layers[k]:8.2f} ms -> {best['layers_ms'][k]:8.2f} ms  {ratio[k]:.2f}x")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--frame", default="kitti00")
    ap.add_argument("--weights", default="random")
    ap.add_argument("--cr", type=float, default=1.0, help="channel ratio of --weights random")
    ap.add_argument("--precision", default="fp32", help="auto, fp32, bf16 or int8")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--runs", type=positive_int, default=5)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    frame = common.load_frame(a.frame)
    sensor = common.sensor_of(a.frame)
    pipeline = build_pipeline(a.weights, "cpu", a.cr, precision=a.precision)
    threads = sorted(set(a.threads))
    print(
        f"{a.frame}: {len(frame.points)} points, weights {a.weights} "
        f"(cr {pipeline.model.config.cr}), "
        f"precision {pipeline.precision}, threads {threads}, {a.runs} interleaved runs, "
        f"{time.strftime('%Y-%m-%d %H:%M')}"
    )
    before = torch.get_num_threads()
    try:
        result = measure(pipeline, frame.points, sensor, threads, a.runs)
    finally:
        common.set_threads(before)
    report(result, threads, a.top)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({str(k): v for k, v in result.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
