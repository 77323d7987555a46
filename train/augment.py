"""Point-cloud augmentations for training, deterministic given a numpy Generator.

Every function takes (points float32 [N, 4] x, y, z, intensity, labels [N]) and returns new
arrays that stay aligned row for row (a dropped point drops its label with it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def rotate_z(points, labels, rng: np.random.Generator):
    theta = rng.uniform(0.0, 2.0 * np.pi)
    c, s = np.cos(theta), np.sin(theta)
    out = points.copy()
    x, y = points[:, 0].copy(), points[:, 1].copy()
    out[:, 0], out[:, 1] = c * x - s * y, s * x + c * y
    return out, labels


def scale(points, labels, rng: np.random.Generator, low: float = 0.95, high: float = 1.05):
    out = points.copy()
    out[:, :3] *= np.float32(rng.uniform(low, high))
    return out, labels


def flip_xy(points, labels, rng: np.random.Generator):
    out = points.copy()
    fx, fy = rng.random(2) < 0.5
    if fx:
        out[:, 0] = -out[:, 0]
    if fy:
        out[:, 1] = -out[:, 1]
    return out, labels


def jitter(points, labels, rng: np.random.Generator, sigma: float = 0.01, clip: float = 0.05):
    out = points.copy()
    noise = np.clip(rng.normal(0.0, sigma, (len(points), 3)), -clip, clip)
    out[:, :3] += noise.astype(np.float32)
    return out, labels


def beam_dropout(points, labels, rng: np.random.Generator, bins: int = 64,
                 drop_fraction: float = 0.1):
    """Drops every point of a random subset of elevation bins (a stand-in for missing beams)."""
    if len(points) == 0:
        return points, labels
    rxy = np.hypot(points[:, 0], points[:, 1])
    elevation = np.arctan2(points[:, 2], np.maximum(rxy, 1e-6))
    lo, hi = float(elevation.min()), float(elevation.max())
    idx = np.clip(((elevation - lo) / max(hi - lo, 1e-9) * bins).astype(np.int64), 0, bins - 1)
    dropped = rng.random(bins) < drop_fraction
    keep = ~dropped[idx]
    return points[keep], labels[keep]


def intensity_noise(points, labels, rng: np.random.Generator, sigma: float = 0.02):
    out = points.copy()
    out[:, 3] = np.clip(out[:, 3] + rng.normal(0.0, sigma, len(points)).astype(np.float32), 0, 1)
    return out, labels


@dataclass(frozen=True)
class AugmentConfig:
    rotate: bool = True
    scale: bool = True
    flip: bool = True
    jitter: bool = True
    beam_dropout: float = 0.1     # fraction of elevation bins dropped (0: off)
    intensity_sigma: float = 0.02  # 0: off


def augment(points: np.ndarray, labels: np.ndarray, rng: np.random.Generator,
            config: AugmentConfig = AugmentConfig()) -> tuple[np.ndarray, np.ndarray]:
    """All enabled augmentations in a fixed order; same rng state -> same output."""
    points = np.asarray(points, dtype=np.float32)
    labels = np.asarray(labels)
    if len(points) != len(labels):
        raise ValueError(f"{len(points)} points but {len(labels)} labels")
    if config.beam_dropout > 0:
        points, labels = beam_dropout(points, labels, rng, drop_fraction=config.beam_dropout)
    if config.rotate:
        points, labels = rotate_z(points, labels, rng)
    if config.scale:
        points, labels = scale(points, labels, rng)
    if config.flip:
        points, labels = flip_xy(points, labels, rng)
    if config.jitter:
        points, labels = jitter(points, labels, rng)
    if config.intensity_sigma > 0:
        points, labels = intensity_noise(points, labels, rng, config.intensity_sigma)
    return points.astype(np.float32, copy=False), labels
