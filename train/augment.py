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


def beam_dropout(
    points, labels, rng: np.random.Generator, bins: int = 64, drop_fraction: float = 0.1
):
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


def sector_dropout(points, labels, rng: np.random.Generator, max_degrees: float = 45.0):
    """Drops every point in one random azimuth sector up to max_degrees wide (an occluded or
    missing part of the sweep)."""
    width = np.deg2rad(rng.uniform(5.0, max_degrees))
    start = rng.uniform(-np.pi, np.pi)
    azimuth = np.arctan2(points[:, 1], points[:, 0])
    keep = np.mod(azimuth - start, 2.0 * np.pi) >= width
    return points[keep], labels[keep]


def sector_crop(points, labels, rng: np.random.Generator, degrees: float):
    """Keeps only the points in one random azimuth wedge `degrees` wide (a cheaper training
    sample that still has the full range of distances)."""
    start = rng.uniform(-np.pi, np.pi)
    azimuth = np.arctan2(points[:, 1], points[:, 0])
    keep = np.mod(azimuth - start, 2.0 * np.pi) < np.deg2rad(degrees)
    return points[keep], labels[keep]


def swap_sector(
    points, labels, other_points, other_labels, rng: np.random.Generator, degrees: float = 180.0
):
    """Replaces one random azimuth sector `degrees` wide by the same sector of another scan of
    the same sensor (a scene mix in the manner of PolarMix): the rest of the sweep stays, so
    one sample joins two streets and the network cannot name the ground from the scene alone."""
    width = np.deg2rad(degrees)
    start = rng.uniform(-np.pi, np.pi)

    def inside(p):
        return np.mod(np.arctan2(p[:, 1], p[:, 0]) - start, 2.0 * np.pi) < width

    keep, take = ~inside(points), inside(other_points)
    return (
        np.concatenate([points[keep], other_points[take]]),
        np.concatenate([labels[keep], np.asarray(other_labels)[take].astype(labels.dtype)]),
    )


def translate(
    points, labels, rng: np.random.Generator, sigma_xy: float = 0.2, sigma_z: float = 0.05
):
    """Shifts the whole scan (a slightly different sensor position and mounting height)."""
    out = points.copy()
    out[:, :3] += rng.normal(0.0, [sigma_xy, sigma_xy, sigma_z]).astype(np.float32)
    return out, labels


def intensity_noise(
    points, labels, rng: np.random.Generator, sigma: float = 0.02, gain: float = 0.0
):
    """Per-point noise plus (gain > 0) one scan-wide factor in 1 +- gain (sensor calibration)."""
    out = points.copy()
    factor = np.float32(rng.uniform(1.0 - gain, 1.0 + gain)) if gain > 0 else np.float32(1.0)
    noise = rng.normal(0.0, sigma, len(points)).astype(np.float32)
    out[:, 3] = np.clip(out[:, 3] * factor + noise, 0, 1)
    return out, labels


def paste_instances(
    points,
    labels,
    rng: np.random.Generator,
    bank,
    count: int,
    ground_classes,
    exclude_sources: tuple[str, ...] = (),
    clearance: float = 0.3,
    max_blocking: int = 5,
):
    """Pastes up to `count` instances drawn from `bank` (train/real.py Instance: points, label,
    source) into the scan: each is rotated about the sensor's z axis by a random angle (same
    range and height, so its beam pattern stays plausible), lifted onto the median height of the
    ground points under its footprint, and pasted only where that footprint (grown by
    `clearance`) holds ground points and at most `max_blocking` labelled points of anything
    else (unlabelled points, 255, neither block nor carry). Instances from `exclude_sources` (the
    scans in the sample) are never drawn. New rows are appended."""
    pool = [i for i in bank if i.source not in exclude_sources]
    if not pool or count <= 0:
        return points, labels
    ground = np.isin(labels, ground_classes)
    other = ~ground & (labels < 255)
    add_p, add_l = [points], [labels]
    for k in rng.integers(0, len(pool), count):
        inst = pool[k]
        theta = rng.uniform(0.0, 2.0 * np.pi)
        c, s = np.cos(theta), np.sin(theta)
        p = inst.points.copy()
        x, y = p[:, 0].copy(), p[:, 1].copy()
        p[:, 0], p[:, 1] = c * x - s * y, s * x + c * y
        lo, hi = p[:, :2].min(axis=0) - clearance, p[:, :2].max(axis=0) + clearance
        cur = np.concatenate(add_p)
        inside = np.all((cur[:, :2] >= lo) & (cur[:, :2] <= hi), axis=1)
        cur_ground = np.concatenate([ground] + [np.zeros(len(a), bool) for a in add_p[1:]])
        cur_other = np.concatenate([other] + [np.ones(len(a), bool) for a in add_p[1:]])
        under = inside & cur_ground
        if under.sum() < 3 or (inside & cur_other).sum() > max_blocking:
            continue
        p[:, 2] += np.float32(np.median(cur[under, 2]) - p[:, 2].min())
        add_p.append(p)
        add_l.append(np.full(len(p), inst.label, dtype=labels.dtype))
    return np.concatenate(add_p), np.concatenate(add_l)


@dataclass(frozen=True)
class AugmentConfig:
    rotate: bool = True
    scale: bool = True
    flip: bool = True
    jitter: bool = True
    beam_dropout: float = 0.1  # fraction of elevation bins dropped (0: off)
    intensity_sigma: float = 0.02  # 0: off
    sector_dropout: float = 0.0  # probability of dropping one azimuth sector
    translate: bool = False
    scale_range: tuple[float, float] = (0.95, 1.05)
    intensity_gain: float = 0.0  # scan-wide intensity factor in 1 +- gain (0: off)


REAL_AUGMENT = AugmentConfig(
    sector_dropout=0.5, translate=True, scale_range=(0.9, 1.1), intensity_gain=0.1
)


def augment(
    points: np.ndarray,
    labels: np.ndarray,
    rng: np.random.Generator,
    config: AugmentConfig = AugmentConfig(),
) -> tuple[np.ndarray, np.ndarray]:
    """All enabled augmentations in a fixed order; same rng state -> same output."""
    points = np.asarray(points, dtype=np.float32)
    labels = np.asarray(labels)
    if len(points) != len(labels):
        raise ValueError(f"{len(points)} points but {len(labels)} labels")
    if config.beam_dropout > 0:
        points, labels = beam_dropout(points, labels, rng, drop_fraction=config.beam_dropout)
    if config.sector_dropout > 0 and rng.random() < config.sector_dropout:
        points, labels = sector_dropout(points, labels, rng)
    if config.rotate:
        points, labels = rotate_z(points, labels, rng)
    if config.scale:
        points, labels = scale(points, labels, rng, *config.scale_range)
    if config.translate:
        points, labels = translate(points, labels, rng)
    if config.flip:
        points, labels = flip_xy(points, labels, rng)
    if config.jitter:
        points, labels = jitter(points, labels, rng)
    if config.intensity_sigma > 0:
        points, labels = intensity_noise(
            points, labels, rng, config.intensity_sigma, config.intensity_gain
        )
    return points.astype(np.float32, copy=False), labels
