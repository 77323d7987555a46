"""Network stage in fp32, bf16 and int8 (kernels/precision.py), side by side in one run, on
real frames.

    python -m bench.precision [--weights default]
                              [--frames kitti00 nuscenes ouster128 kitti-spvnas]
                              [--threads 2] [--runs 9] [--precisions fp32 bf16 int8 ...]
                              [--json OUT]

--precisions defaults to fp32 bf16; bench.sensor_rate passes every precision and int8 kernel the
CPU has.

Per frame: the same voxels and maps, the network stage (what the service times as "network":
the network and its head's argmax, SegmentationPipeline.network_stage) timed alternately in each
precision (run r of every precision before run r + 1 of any, so a shared machine's load hits
them alike);
prints each precision's median network time with its spread (min..max), and the speed-up of
each precision over fp32 as the median of the per-run ratios with their spread. Then the labels
of the whole pipeline in each precision against fp32 (share of equal labels), and on the
labelled validation frames (SemanticKITTI seq00_000000, spvnas_000000) the mIoU in each.
The CPU's features (what `auto` chooses from) head the output. On a CPU with AMX, a name with
"-avx512" appended (int8-avx512, bf16-avx512) runs that precision with AMX tiles off, on the
AVX-512 kernels, so the tiles' gain is measured side by side too; int8@avx_vnni and int8@avx2
run int8 on those 256-bit kernels (where the CPU has them), to compare them with int8's best.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import time

from app.heap import configure_malloc
from app.threads import configure_env

# before torch loads libgomp and before any thread starts: the network runs under the server's
# process settings (`python -m app`), glibc's heap among them, which reuses one forward's
# buffers in the next instead of faulting in fresh pages (about 6 ms of the int8 network here)
configure_env()
configure_malloc()

import torch  # noqa: E402

from app.inference.builder import load_model, pipeline_for  # noqa: E402
from app.inference.scoring import iou_metrics, read_labels  # noqa: E402
from app.inference.voxelize import voxelize  # noqa: E402
from bench import common  # noqa: E402
from kernels import amx  # noqa: E402
from kernels import precision as precision_mod  # noqa: E402
from models import SparseTensor  # noqa: E402
from app.argtypes import positive_int  # noqa: E402

LABELLED = {
    "kitti00": "semantickitti/seq00_000000.label",
    "kitti-spvnas": "semantickitti/spvnas_000000.label",
}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} [{min(values):.3g}..{max(values):.3g}]"


NO_TILES = "-avx512"  # a precision name ending so runs with AMX tiles off (the AVX-512 kernels)
KERNEL = "@"  # int8@avx2, int8@avx_vnni: int8 on that kernel (precision.INT8_KERNELS)


def kernels_for(name: str):
    """A context in which `name`'s kernels run: AMX tiles off for NAME-avx512, the int8 kernel
    named after KERNEL, else as set (ValueError for a kernel this CPU cannot run)."""
    if name.endswith(NO_TILES):
        return amx.tiles_off()
    if KERNEL in name:
        return precision_mod.int8_kernel_set(name.split(KERNEL, 1)[1])
    return contextlib.nullcontext()


def precision_of(name: str) -> str:
    """The precision a --precisions name runs (int8-avx512, int8@avx2: int8)."""
    return name.removesuffix(NO_TILES).split(KERNEL, 1)[0]


def time_networks(pipes: dict, points, sensor: str, runs: int):
    """(wall ms, process CPU ms) per network stage, per precision, runs interleaved. CPU time
    leaves out the time the OS gave other processes, so on a shared machine its ratio is the
    steadier one (it counts OpenMP's idle waiting too: set OMP_WAIT_POLICY=passive)."""
    inputs = {}
    for name, pipe in pipes.items():
        batch = voxelize([points], pipe.voxel_config, sensor, pipe.device)
        x = SparseTensor(batch.feats, batch.coords, engine=pipe.engine)
        x.manager.prepare(pipe.map_requests())  # the maps stage
        inputs[name] = x
    wall: dict[str, list[float]] = {name: [] for name in pipes}
    cpu: dict[str, list[float]] = {name: [] for name in pipes}
    with torch.no_grad():
        for name, pipe in pipes.items():  # warm-up: plans, weight conversion, workspaces
            with kernels_for(name):
                pipe.network_stage(inputs[name])
        gc.freeze()  # as the server does after its warm-up (app/service/main.py)
        for _ in range(runs):
            for name, pipe in pipes.items():
                with kernels_for(name):
                    c0, t0 = time.process_time(), time.perf_counter()
                    pipe.network_stage(inputs[name])
                    wall[name].append((time.perf_counter() - t0) * 1e3)
                cpu[name].append((time.process_time() - c0) * 1e3)
    return wall, cpu


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--weights", default="default")
    p.add_argument("--cr", type=float, default=1.0, help="channel ratio of --weights random")
    p.add_argument("--frames", nargs="+", default=list(common.DEFAULT_FRAMES) + ["kitti-spvnas"])
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--runs", type=positive_int, default=9)
    p.add_argument("--data", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.threads:
        common.set_threads(args.threads)
    model, meta = load_model(args.weights, args.cr)
    names = meta["class_names"]
    pipes = {}
    for name in args.precisions:
        try:
            with kernels_for(name):
                pipes[name] = pipeline_for(model, meta, "cpu", precision=precision_of(name))
        except ValueError as e:  # a precision or int8 kernel this CPU cannot run
            print(f"# {name} left out: {e}")
    if not pipes:
        raise SystemExit("none of --precisions runs on this CPU")
    info = precision_mod.describe("auto", precision_mod.resolve("auto"))
    print(
        f"# bench.precision weights={args.weights} threads={torch.get_num_threads()} "
        f"runs={args.runs} torch={torch.__version__}; CPU features {info['cpu_features']}; "
        f"auto -> {info['running']}; bf16 kernel: {info['bf16_kernel']}; "
        f"int8 kernel: {info['int8_kernel']}"
    )
    report = {"cpu": info, "frames": {}}
    base = next(iter(pipes))
    for frame_name in args.frames:
        frame = common.load_frame(frame_name, args.data)
        sensor = common.sensor_of(frame_name)
        times, cpu = time_networks(pipes, frame.points, sensor, args.runs)
        labels = {}
        for name, pipe in pipes.items():
            with kernels_for(name):
                labels[name] = pipe.segment(frame.points, sensor).labels
        row = {"points": len(frame.points)}
        line = f"{frame_name}: {len(frame.points)} points"
        for name in pipes:
            ratios = [b / t for b, t in zip(times[base], times[name])]
            cpu_ratios = [b / t for b, t in zip(cpu[base], cpu[name])]
            agree = float((labels[name] == labels[base]).mean())
            row[name] = {
                "network_ms": times[name],
                "network_cpu_ms": cpu[name],
                "speedup": ratios,
                "cpu_speedup": cpu_ratios,
                "label_agreement": agree,
            }
            line += f"\n  {name}: network {spread(times[name])} ms (CPU {spread(cpu[name])} ms)"
            if name != base:
                line += (
                    f", x{spread(ratios)} vs {base} (CPU time x{spread(cpu_ratios)}), "
                    f"labels {agree * 100:.2f} % equal"
                )
        if frame_name in LABELLED:
            gt = read_labels(
                common.DEFAULT_DATA / LABELLED[frame_name]
                if args.data is None
                else f"{args.data}/{LABELLED[frame_name]}"
            )
            for name in pipes:
                row[name]["miou"] = iou_metrics(gt, labels[name], names)["miou"]
            line += "\n  mIoU " + ", ".join(f"{n} {row[n]['miou']:.4f}" for n in pipes)
        print(line, flush=True)
        report["frames"][frame_name] = row
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
