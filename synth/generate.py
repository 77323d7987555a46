"""Synthetic frames: generate_frame(seed, profile), KITTI writer and a command line.

    python -m synth.generate --seed 0 --count 10 --out /tmp/synth [--profile hdl64]

writes DIR/velodyne/NNNNNN.bin (float32 x,y,z,intensity) and DIR/labels/NNNNNN.label (uint32 raw
SemanticKITTI ids in the low 16 bits, instance 0), frame k from seed S + k.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from synth.classes import CLASS_NAMES, NUM_CLASSES
from synth.scene import build_scene
from synth.sensor import HDL64, PROFILES, SensorProfile, scan
from app.argtypes import non_negative_int, positive_int


@dataclass
class SyntheticFrame:
    points: np.ndarray  # float32 [N,4] x, y, z, intensity in the sensor frame
    labels: np.ndarray  # uint8 [N] training class ids 0..18
    raw_labels: np.ndarray  # uint32 [N] raw SemanticKITTI ids (lane marking 60 -> road)
    profile: str
    seed: int


def generate_frame(seed: int, profile: SensorProfile = HDL64) -> SyntheticFrame:
    """One scan of the scene for seed; identical arrays for identical (seed, profile)."""
    scene = build_scene(seed)
    rng = np.random.default_rng([int(seed), 0x5E75])
    pts, labels, raw = scan(scene, profile, rng)
    return SyntheticFrame(pts, labels, raw, profile.name, int(seed))


def write_kitti(frame: SyntheticFrame, bin_path, label_path) -> None:
    """KITTI .bin (float32 x,y,z,intensity) and .label (uint32 raw semantic id, instance 0)."""
    Path(bin_path).parent.mkdir(parents=True, exist_ok=True)
    Path(label_path).parent.mkdir(parents=True, exist_ok=True)
    np.ascontiguousarray(frame.points, dtype=np.float32).tofile(bin_path)
    np.ascontiguousarray(frame.raw_labels, dtype=np.uint32).tofile(label_path)


def read_kitti(bin_path, label_path) -> tuple[np.ndarray, np.ndarray]:
    pts = np.fromfile(bin_path, dtype=np.float32).reshape(-1, 4)
    return pts, np.fromfile(label_path, dtype=np.uint32) & 0xFFFF


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=non_negative_int, default=0)
    ap.add_argument("--count", type=positive_int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", choices=sorted(PROFILES), default="hdl64")
    a = ap.parse_args(argv)
    out = Path(a.out)
    for k in range(a.count):
        t0 = time.perf_counter()
        f = generate_frame(a.seed + k, PROFILES[a.profile])
        write_kitti(f, out / "velodyne" / f"{k:06d}.bin", out / "labels" / f"{k:06d}.label")
        hist = np.bincount(f.labels, minlength=NUM_CLASSES)
        present = sum(1 for c in range(NUM_CLASSES) if hist[c])
        print(
            f"{k:06d} seed={a.seed + k} points={len(f.points)} classes={present}/"
            f"{len(CLASS_NAMES)} {time.perf_counter() - t0:.2f}s",
            flush=True,
        )


if __name__ == "__main__":
    main()
