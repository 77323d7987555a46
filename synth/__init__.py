"""Deterministic synthetic LiDAR street scenes (procedural meshes + Open3D ray casting).

Never reads real frames: every point comes from a procedurally generated scene and a simulated
sensor. Entry points: `synth.generate.generate_frame`, `synth.generate.write_kitti`.
"""

from synth.classes import CLASS_NAMES, NUM_CLASSES, IGNORE, TRAIN_TO_RAW
from synth.sensor import HDL64, NUSCENES32, OUSTER128, PROFILES, SensorProfile

__all__ = [
    "CLASS_NAMES",
    "NUM_CLASSES",
    "IGNORE",
    "TRAIN_TO_RAW",
    "HDL64",
    "NUSCENES32",
    "OUSTER128",
    "PROFILES",
    "SensorProfile",
]
