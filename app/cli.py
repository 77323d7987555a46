"""Command line: the HTTP service, its client, and in-process segmentation.

    python -m app [serve] [--host H] [--port P] [--device auto|cpu|cuda] [--weights W]
                  [--precision auto|fp32|bf16|int8]
                                         start the HTTP service (every option is also an
                                         environment variable LIDARSEG_<OPTION>, see
                                         app/service/config.py)
    python -m app client FRAME [--url URL] [--format F] [--repeat N --concurrency C]
                                         POST a frame to a running service: per-class counts and
                                         timing, or with --repeat latency percentiles + throughput
    python -m app segment FRAME [--weights W] [--format F] [--sensor S] [--precision P]
                                [--layers]       in-process, no server
    python -m app crosscheck FRAME [--weights W]     ours vs the spconv twin, one JSON line
    python -m app evaluate FRAME.bin LABELS.label [--weights W]   mIoU, one JSON line

W: "default" (the shipped model, models/weights/MODEL_CARD.md), "synthetic", "random" (a
fixed-seed random MinkUNet of channel ratio --cr), a lidarseg checkpoint path, or LAYOUT:PATH (a
reference checkpoint imported on load); app/inference/builder.py builds the pipeline for every
command. The service is started through `serve` only (app.service.main.create_app).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from kernels.precision import PRECISIONS, PrecisionError
from models.labels import class_counts

from app import stop_signals
from app.argtypes import positive_int
from app.codecs import SENSORS
from app.codecs.files import posting_format, read_frame
from app.inference.builder import build_pipeline

DEFAULT_FRAME = (
    Path(__file__).resolve().parents[2]
    / "shared"
    / "data"
    / "real"
    / "semantickitti"
    / "seq00_000000.bin"
)
WEIGHTS_HELP = (
    "'default' or 'synthetic' (shipped), 'random' (with --cr), a lidarseg checkpoint, "
    "or LAYOUT:PATH (a reference checkpoint to import; see models/weights)"
)


def cmd_segment(args) -> int:
    points, sensor = read_frame(args.frame, args.format, args.sensor)  # ValueError: one line
    pipeline = build_pipeline(args.weights, args.device, args.cr, precision=args.precision)
    names = pipeline.meta["class_names"]
    pipeline.segment(points[: min(len(points), 5000)], sensor)  # warm-up
    result = pipeline.segment(points, sensor, layer_timing=args.layers)
    print(
        f"frame {args.frame}: {result.num_points} points, {result.num_voxels} voxels, "
        f"{result.ignored_points} ignored {result.ignored}; precision {pipeline.precision}"
    )
    for name, count in sorted(class_counts(result.labels, names).items(), key=lambda t: -t[1]):
        print(f"  {name:<14} {count:>8}")
    print("timing_ms " + json.dumps({k: round(v, 2) for k, v in result.timing_ms.items()}))
    if args.layers:
        top = sorted((result.layer_ms or {}).items(), key=lambda t: -t[1])[:15]
        print("slowest layers (ms): " + json.dumps({k: round(v, 2) for k, v in top}))
    return 0


def cmd_crosscheck(args) -> int:
    from app.inference.crosscheck import crosscheck

    points, sensor = read_frame(args.frame, args.format, args.sensor)
    pipeline = build_pipeline(args.weights, args.device, args.cr, precision=args.precision)
    print(json.dumps(crosscheck(pipeline, points, sensor)))
    return 0


def cmd_evaluate(args) -> int:
    """mIoU, per-class IoU and accuracy of one labelled frame, one JSON line."""
    from app.inference.scoring import iou_metrics, read_labels

    points, sensor = read_frame(args.frame, args.format, args.sensor)
    gt = read_labels(args.labels)
    if len(gt) != len(points):
        raise ValueError(f"{args.frame}: {len(points)} points but {args.labels}: {len(gt)} labels")
    pipeline = build_pipeline(args.weights, args.device, args.cr, precision=args.precision)
    result = pipeline.segment(points, sensor)
    print(json.dumps(iou_metrics(gt, result.labels, pipeline.meta["class_names"])))
    return 0


def cmd_serve(args) -> int:
    overrides = {
        k: getattr(args, k)
        for k in ("host", "port", "device", "weights", "precision")
        if getattr(args, k, None) is not None
    }
    from app.service.server import serve  # the one entry from the command line into the service

    return serve(overrides)


def cmd_client(args) -> int:
    from app.client import main as client_main

    args.format = posting_format(Path(args.frame), args.format)
    return client_main(args)


def add_serve_options(p: argparse.ArgumentParser, default=None) -> None:
    """The server options; the `serve` subcommand passes argparse.SUPPRESS so options given
    before the subcommand (`python -m app --port 9000 serve`) are kept."""
    p.add_argument(
        "--host", default=default, help="bind address (LIDARSEG_HOST, default 127.0.0.1)"
    )
    p.add_argument("--port", type=int, default=default, help="port (LIDARSEG_PORT, default 8000)")
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default=default,
        help="LIDARSEG_DEVICE; auto = cuda if available (default)",
    )
    p.add_argument("--weights", default=default, help="LIDARSEG_WEIGHTS: " + WEIGHTS_HELP)
    add_precision_option(p, default)


PRECISIONS_HELP = (
    "auto (int8 where the CPU has an int8 kernel: AMX, AVX512_VNNI, AVX_VNNI or AVX2; else bf16 "
    "where it has AVX512_BF16 or AMX; else fp32; the default), fp32, bf16, int8 (AVX2 at least)"
)
PRECISION_HELP = "LIDARSEG_PRECISION on the CPU: " + PRECISIONS_HELP


def add_precision_option(p: argparse.ArgumentParser, default=None) -> None:
    p.add_argument("--precision", choices=PRECISIONS, default=default, help=PRECISION_HELP)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m app",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_serve_options(parser)
    parser.set_defaults(func=cmd_serve)
    sub = parser.add_subparsers(dest="command")
    serve_p = sub.add_parser("serve", help="start the HTTP service")
    add_serve_options(serve_p, argparse.SUPPRESS)
    serve_p.set_defaults(func=cmd_serve)
    client_p = sub.add_parser("client", help="POST a frame to a running service")
    client_p.add_argument("frame")
    client_p.add_argument("--url", default="http://127.0.0.1:8000", help="%(default)s")
    client_p.add_argument(
        "--format",
        default=None,
        help="?format= (kitti, nuscenes, ouster, pcd, ply, las, json, ...); default: a .bin "
        "file's raw layout by its name, else the service reads the bytes",
    )
    add_sensor_option(client_p)
    client_p.add_argument(
        "--repeat", type=positive_int, default=1, help="post it N times: latency percentiles"
    )
    client_p.add_argument(
        "--concurrency", type=positive_int, default=1, help="with --repeat: C at once"
    )
    client_p.add_argument(
        "--deadline-ms",
        type=float,
        default=None,
        help="X-Deadline-Ms: the frame is refused (504) rather than answered later than this",
    )
    client_p.add_argument(
        "--stream-id",
        default=None,
        help="X-Stream-Id: a newer frame of it drops the older ones still queued (409)",
    )
    client_p.add_argument("--api-key", default=None, help="default: env LIDARSEG_API_KEY")
    client_p.add_argument("--binary", action="store_true", help="ask for uint8 labels")
    client_p.set_defaults(func=cmd_client)
    for name, func, what in (
        ("segment", cmd_segment, "segment a frame file in process: per-class counts, timing"),
        ("crosscheck", cmd_crosscheck, "ours against the spconv twin on a frame, one JSON line"),
    ):
        p = sub.add_parser(name, help=what)
        p.add_argument("frame", nargs="?", default=str(DEFAULT_FRAME))
        add_model_options(p, "fp32" if name == "crosscheck" else "auto")
        if name == "segment":
            p.add_argument("--layers", action="store_true", help="per-layer network timing")
        p.set_defaults(func=func)
    eval_p = sub.add_parser("evaluate", help="mIoU on a labelled KITTI frame (.bin + .label)")
    eval_p.add_argument("frame")
    eval_p.add_argument("labels")
    add_model_options(eval_p, "auto")
    eval_p.set_defaults(func=cmd_evaluate)
    args = parser.parse_args(argv)
    if args.func is not cmd_serve:  # only the service acts on a stop signal held since start
        stop_signals.release()
    try:
        return args.func(args)
    except PrecisionError as e:  # bf16 or int8 this CPU cannot run: a setting, as argparse's 2
        print(f"lidarseg: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:  # a file, a format, a value: the user's to mend
        print(f"lidarseg {args.command or 'serve'}: {e}", file=sys.stderr)
        return 1


def add_model_options(p: argparse.ArgumentParser, precision: str) -> None:
    """The options of the in-process commands (segment, crosscheck, evaluate)."""
    p.add_argument("--weights", default="default", help=WEIGHTS_HELP)
    p.add_argument(
        "--format",
        default=None,
        help="a wire format (kitti, nuscenes, ouster, xyz, pcd, ply, las, json, npy, ...); "
        "default: by the file's name (.bin, .npy), else its bytes",
    )
    add_sensor_option(p)
    p.add_argument("--cr", type=float, default=1.0, help="channel ratio of --weights random")
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        type=_device,
        help="auto: cuda where available",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=precision,
        help="CPU arithmetic: " + PRECISIONS_HELP,
    )


def add_sensor_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sensor",
        choices=SENSORS,
        default=None,
        help="the frame's intensity convention (kitti 0..1; nuscenes, ouster 0..255); default: "
        "the raw format's, else 0..255 when at least 1%% of the intensities exceed 1",
    )


def _device(name: str) -> str:
    """--device: auto resolved; cuda refused without a CUDA device (argparse's one line)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError("cuda: no CUDA device is available")
    return name
