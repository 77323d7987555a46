"""Command line, in-process (no server).

    python -m app                        segment the default real frame (a demonstration)
    python -m app segment FRAME [--weights W] [--format F] [--layers]
    python -m app crosscheck FRAME [--weights W]     ours vs the spconv twin, one JSON line
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from models.minkunet import MinkUNet

from .frames import read_frame
from .pipeline import IGNORE_LABEL, SegmentationPipeline
from .voxelize import VoxelizeConfig

DEFAULT_FRAME = (Path(__file__).resolve().parents[2] / "shared" / "data" / "real" / "semantickitti"
                 / "seq00_000000.bin")
SEMANTIC_KITTI = ("car", "bicycle", "motorcycle", "truck", "other-vehicle", "person", "bicyclist",
                  "motorcyclist", "road", "parking", "sidewalk", "other-ground", "building",
                  "fence", "vegetation", "trunk", "terrain", "pole", "traffic-sign")


def load_model(weights: str | None, cr: float) -> tuple[MinkUNet, list[str], float]:
    """(model, class names, voxel size): from a checkpoint, else a fixed-seed random init."""
    if weights:
        from models.checkpoints import load_checkpoint

        model, meta = load_checkpoint(weights)
        return model, list(meta["class_names"]), float(meta["voxel_size"])
    torch.manual_seed(0)
    return MinkUNet(cr=cr), list(SEMANTIC_KITTI), 0.05


def class_counts(labels: np.ndarray, names: list[str]) -> dict[str, int]:
    counts = np.bincount(labels, minlength=256)
    out = {names[i]: int(counts[i]) for i in range(len(names)) if counts[i]}
    if counts[IGNORE_LABEL]:
        out["ignore"] = int(counts[IGNORE_LABEL])
    return out


def cmd_segment(args) -> int:
    points, sensor = read_frame(args.frame, args.format)
    model, names, voxel = load_model(args.weights, args.cr)
    pipeline = SegmentationPipeline(model, VoxelizeConfig(voxel_size=voxel), args.device)
    pipeline.segment(points[: min(len(points), 5000)], sensor)  # warm-up
    result = pipeline.segment(points, sensor, layer_timing=args.layers)
    print(f"frame {args.frame}: {result.num_points} points, {result.num_voxels} voxels, "
          f"{result.ignored_points} ignored {result.ignored}")
    for name, count in sorted(class_counts(result.labels, names).items(), key=lambda t: -t[1]):
        print(f"  {name:<14} {count:>8}")
    print("timing_ms " + json.dumps({k: round(v, 2) for k, v in result.timing_ms.items()}))
    if args.layers:
        top = sorted(result.layer_ms.items(), key=lambda t: -t[1])[:15]
        print("slowest layers (ms): " + json.dumps({k: round(v, 2) for k, v in top}))
    return 0


def cmd_crosscheck(args) -> int:
    from .crosscheck import crosscheck

    points, sensor = read_frame(args.frame, args.format)
    model, _, voxel = load_model(args.weights, args.cr)
    print(json.dumps(crosscheck(model, points, sensor, voxel)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    for name, func in (("segment", cmd_segment), ("crosscheck", cmd_crosscheck)):
        p = sub.add_parser(name)
        p.add_argument("frame", nargs="?", default=str(DEFAULT_FRAME))
        p.add_argument("--weights", default=None, help="lidarseg checkpoint (default: random init)")
        p.add_argument("--format", default=None, help="kitti, nuscenes, ouster, xyz, npy")
        p.add_argument("--cr", type=float, default=1.0, help="channel ratio without --weights")
        p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
        p.add_argument("--layers", action="store_true", help="per-layer network timing")
        p.set_defaults(func=func)
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["segment", *(argv or [])])
    return args.func(args)
