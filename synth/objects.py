"""Procedural street objects: vehicles, people, riders, vegetation, poles, signs, fences.

Each builder takes a numpy Generator, a ground position (x, y), a yaw, and returns Parts. Local
frames: x forward, y left, z up, ground at z = 0.
"""

from __future__ import annotations

import numpy as np

from synth import classes as C
from synth.primitives import Part, box, cylinder, ellipsoid

RAW = C.TRAIN_TO_RAW


def _at(x, y, yaw, lx, ly, lz):
    c, s = np.cos(yaw), np.sin(yaw)
    return (x + c * lx - s * ly, y + s * lx + c * ly, lz)


def _p(mesh, cls, refl):
    return Part(mesh, cls, RAW[cls], refl)


def _wheels(x, y, yaw, length, width, r, cls, refl=0.1):
    out = []
    for fx in (-0.32, 0.32):
        for side in (-0.5, 0.5):
            out.append(
                _p(
                    cylinder(
                        _at(x, y, yaw, fx * length, side * width, r), r, 0.22, axis="y", yaw=yaw
                    ),
                    cls,
                    refl,
                )
            )
    return out


def car(rng, x, y, yaw):
    L, W = rng.uniform(3.8, 4.9), rng.uniform(1.65, 1.9)
    hb, hc = rng.uniform(0.6, 0.8), rng.uniform(0.45, 0.6)
    refl = rng.uniform(0.3, 0.8)
    parts = [
        _p(box(_at(x, y, yaw, 0, 0, 0.3 + hb / 2), (L, W, hb), yaw), C.CAR, refl),
        _p(
            box(_at(x, y, yaw, -0.1 * L, 0, 0.3 + hb + hc / 2), (0.5 * L, 0.9 * W, hc), yaw),
            C.CAR,
            0.15,
        ),
    ]
    return parts + _wheels(x, y, yaw, L, W, 0.32, C.CAR)


def truck(rng, x, y, yaw):
    L, W, H = rng.uniform(6.5, 10.0), rng.uniform(2.3, 2.55), rng.uniform(3.0, 3.8)
    cab = 2.2
    parts = [
        _p(
            box(_at(x, y, yaw, L / 2 - cab / 2, 0, 0.5 + 1.25), (cab, W, 2.5), yaw),
            C.TRUCK,
            rng.uniform(0.3, 0.7),
        ),
        _p(
            box(_at(x, y, yaw, -cab / 2, 0, 0.7 + (H - 0.7) / 2), (L - cab - 0.2, W, H - 0.7), yaw),
            C.TRUCK,
            rng.uniform(0.4, 0.8),
        ),
    ]
    return parts + _wheels(x, y, yaw, L, W, 0.5, C.TRUCK)


def other_vehicle(rng, x, y, yaw):
    """A bus, tram-like box or a trailer: one long body, windows band, wheels."""
    L, W, H = rng.uniform(8.0, 12.0), rng.uniform(2.4, 2.55), rng.uniform(2.8, 3.3)
    parts = [
        _p(
            box(_at(x, y, yaw, 0, 0, 0.4 + H / 2), (L, W, H), yaw),
            C.OTHER_VEHICLE,
            rng.uniform(0.3, 0.7),
        ),
        _p(
            box(_at(x, y, yaw, 0, 0, 0.4 + H * 0.7), (L * 0.9, W + 0.04, 0.7), yaw),
            C.OTHER_VEHICLE,
            0.1,
        ),
    ]
    return parts + _wheels(x, y, yaw, L, W, 0.5, C.OTHER_VEHICLE)


def person(rng, x, y, yaw=0.0, cls=C.PERSON, z0=0.0, height=None):
    h = height if height is not None else rng.uniform(1.55, 1.9)
    r = rng.uniform(0.16, 0.22)
    legs = 0.47 * h if cls == C.PERSON else 0.0
    body = 0.38 * h
    refl = rng.uniform(0.2, 0.6)
    parts = [
        _p(cylinder(_at(x, y, yaw, 0, 0, z0 + legs + body / 2), r, body), cls, refl),
        _p(ellipsoid(_at(x, y, yaw, 0, 0, z0 + legs + body + 0.12), (0.11, 0.11, 0.13)), cls, 0.3),
    ]
    if legs:
        for side in (-0.09, 0.09):
            parts.append(_p(cylinder(_at(x, y, yaw, 0, side, legs / 2), 0.08, legs), cls, refl))
    return parts


def _two_wheels(x, y, yaw, half_base, r, width, cls, refl):
    """Front and rear wheel of a two-wheeler, axles half_base either side of (x, y)."""
    return [
        _p(
            cylinder(_at(x, y, yaw, fx, 0, r), r, width, axis="y", yaw=yaw, resolution=12),
            cls,
            refl,
        )
        for fx in (-half_base, half_base)
    ]


def bicycle(rng, x, y, yaw):
    parts = _two_wheels(x, y, yaw, 0.52, 0.35, 0.05, C.BICYCLE, 0.35)
    parts.append(_p(box(_at(x, y, yaw, 0, 0, 0.62), (1.0, 0.06, 0.06), yaw), C.BICYCLE, 0.5))
    parts.append(_p(box(_at(x, y, yaw, -0.2, 0, 0.55), (0.05, 0.05, 0.45), yaw), C.BICYCLE, 0.5))
    return parts


def motorcycle(rng, x, y, yaw):
    parts = _two_wheels(x, y, yaw, 0.7, 0.32, 0.14, C.MOTORCYCLE, 0.1)
    parts.append(
        _p(
            box(_at(x, y, yaw, 0, 0, 0.65), (1.4, 0.4, 0.45), yaw),
            C.MOTORCYCLE,
            rng.uniform(0.3, 0.8),
        )
    )
    return parts


def bicyclist(rng, x, y, yaw):
    return bicycle(rng, x, y, yaw) + person(rng, x, y, yaw, cls=C.BICYCLIST, z0=0.7, height=1.1)


def motorcyclist(rng, x, y, yaw):
    return motorcycle(rng, x, y, yaw) + person(
        rng, x, y, yaw, cls=C.MOTORCYCLIST, z0=0.85, height=1.0
    )


def tree(rng, x, y, z0=0.0):
    h = rng.uniform(1.8, 4.0)
    r = rng.uniform(0.12, 0.3)
    parts = [_p(cylinder((x, y, z0 + h / 2), r, h), C.TRUNK, 0.3)]
    crown = rng.uniform(1.5, 3.5)
    for _ in range(int(rng.integers(2, 6))):
        off = rng.normal(0.0, crown * 0.35, 3)
        radii = crown * rng.uniform(0.5, 0.9, 3)
        parts.append(
            _p(
                ellipsoid((x + off[0], y + off[1], z0 + h + crown * 0.6 + off[2] * 0.5), radii),
                C.VEGETATION,
                rng.uniform(0.25, 0.5),
            )
        )
    return parts


def bush(rng, x, y, z0=0.0):
    r = rng.uniform(0.5, 1.5, 3)
    r[2] *= 0.7
    return [_p(ellipsoid((x, y, z0 + r[2] * 0.8), r), C.VEGETATION, rng.uniform(0.25, 0.5))]


def hedge(rng, x0, x1, y, z0=0.0):
    """A trimmed hedge along x from x0 to x1: a row of overlapping flattened ellipsoids."""
    parts, h, w = [], rng.uniform(0.6, 1.8), rng.uniform(0.5, 1.2)
    x = x0
    while x < x1:
        step = rng.uniform(0.8, 1.6)
        parts.append(
            _p(
                ellipsoid(
                    (x + step / 2, y + rng.normal(0, 0.05), z0 + h / 2), (step * 0.8, w / 2, h / 2)
                ),
                C.VEGETATION,
                rng.uniform(0.25, 0.5),
            )
        )
        x += step
    return parts


def pole(rng, x, y, z0=0.0, height=None):
    h = height if height is not None else rng.uniform(4.0, 8.0)
    return [
        _p(
            cylinder((x, y, z0 + h / 2), rng.uniform(0.06, 0.15), h, resolution=8),
            C.POLE,
            rng.uniform(0.4, 0.7),
        )
    ]


def traffic_sign(rng, x, y, yaw, z0=0.0):
    h = rng.uniform(1.6, 2.6)  # panel bottom ~0.1 m below h
    parts = pole(rng, x, y, z0, h)
    w, ph = rng.uniform(0.6, 1.2), rng.uniform(0.6, 1.2)
    parts.append(
        _p(
            box(_at(x, y, yaw, 0.08, 0, z0 + h + ph / 2 - 0.1), (0.03, w, ph), yaw),
            C.TRAFFIC_SIGN,
            rng.uniform(0.85, 1.0),
        )
    )  # retro-reflective
    return parts


def fence(rng, x0, y0, x1, y1, z0=0.0):
    L = float(np.hypot(x1 - x0, y1 - y0))
    yaw = float(np.arctan2(y1 - y0, x1 - x0))
    h = rng.uniform(1.0, 2.0)
    return [
        _p(
            box(((x0 + x1) / 2, (y0 + y1) / 2, z0 + h / 2), (L, 0.06, h), yaw),
            C.FENCE,
            rng.uniform(0.2, 0.5),
        )
    ]
