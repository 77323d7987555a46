"""Procedural street scenes from a seed.

World frame: the road runs along x, y points left, ground (road surface) at z = 0. Per side, from
the road edge outwards: an optional parking strip, a raised sidewalk (curb), then a lot zone of
terrain / other-ground patches carrying buildings, fences, trees and bushes. Vehicles and riders
drive in the lanes; people, poles, signs, trees and parked bicycles stand on the sidewalks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from synth import classes as C
from synth import objects as O
from synth.primitives import Part, box, slab

RAW = C.TRAIN_TO_RAW
LANE_W = 3.5
SIDEWALK_TOP = 0.15


@dataclass
class Scene:
    parts: list[Part]
    sensor_xy: tuple[float, float]  # sensor stands above (x, y) at the profile's mount height
    half_length: float


def _part(mesh, cls, refl, raw=None):
    return Part(mesh, cls, RAW[cls] if raw is None else raw, refl)


class _Lanes:
    """1-D occupancy per lane so that vehicles do not overlap each other or the sensor car."""

    def __init__(self, n: int):
        self.busy: list[list[tuple[float, float]]] = [[] for _ in range(n)]

    def take(self, lane: int, x: float, half: float) -> bool:
        lo, hi = x - half - 1.0, x + half + 1.0
        if any(lo < b and a < hi for a, b in self.busy[lane]):
            return False
        self.busy[lane].append((lo, hi))
        return True


def _road(rng, L, lanes, hw):
    parts = [_part(slab(-L, L, -hw, hw, 0.0), C.ROAD, rng.uniform(0.15, 0.3))]
    dash, gap = rng.uniform(2.5, 4.0), rng.uniform(5.0, 8.0)
    for k in range(1, lanes):
        y = -hw + k * LANE_W
        x = -L + rng.uniform(0, gap)
        while x + dash < L:
            parts.append(
                _part(
                    box((x + dash / 2, y, 0.005), (dash, 0.15, 0.012)),
                    C.ROAD,
                    0.9,
                    raw=C.RAW_LANE_MARKING,
                )
            )
            x += dash + gap
    for y in (-hw + 0.3, hw - 0.3):  # solid edge lines
        parts.append(
            _part(box((0.0, y, 0.005), (2 * L, 0.12, 0.012)), C.ROAD, 0.9, raw=C.RAW_LANE_MARKING)
        )
    return parts


def _lot_zone(rng, L, s, e0, depth):
    """Terrain / other-ground patches from |y| = e0 to e0 + depth on side s."""
    parts, x = [], -L
    y0, y1 = sorted((s * e0, s * (e0 + depth)))
    while x < L:
        seg = min(rng.uniform(10.0, 35.0), L - x)
        cls = C.OTHER_GROUND if rng.random() < 0.3 else C.TERRAIN
        top = 0.08 if cls == C.TERRAIN else 0.12
        parts.append(_part(slab(x, x + seg, y0, y1, top), cls, rng.uniform(0.2, 0.45)))
        x += seg
    return parts


def _buildings(rng, L, s, e0):
    """Buildings with setbacks and facade offsets; fences, trees and bushes in the gaps."""
    parts, x = [], -L + rng.uniform(0, 8)
    while x < L - 5:
        if rng.random() < 0.6:
            length = rng.uniform(8.0, 30.0)
            setback = rng.uniform(0.0, 8.0)
            depth, height = rng.uniform(8.0, 16.0), rng.uniform(4.0, 22.0)
            yc = s * (e0 + setback + depth / 2)
            refl = rng.uniform(0.2, 0.7)
            parts.append(
                _part(
                    box((x + length / 2, yc, height / 2), (length, depth, height)), C.BUILDING, refl
                )
            )
            for _ in range(int(rng.integers(0, 3))):  # bays / balconies / ground-floor offsets
                bl = rng.uniform(2.0, max(2.5, length / 2))
                bx = x + rng.uniform(bl / 2, length - bl / 2)
                out = rng.uniform(0.3, 1.2)
                bz0, bh = rng.uniform(0.0, height * 0.6), rng.uniform(2.5, 6.0)
                bh = min(bh, height - bz0)
                yf = s * (e0 + setback - out / 2)
                parts.append(
                    _part(box((bx, yf, bz0 + bh / 2), (bl, out + 0.05, bh)), C.BUILDING, refl)
                )
            if setback > 2.0 and rng.random() < 0.6:  # front garden: hedge or bushes
                if rng.random() < 0.5:
                    parts += O.hedge(
                        rng, x + 0.5, x + length - 0.5, s * (e0 + rng.uniform(0.5, 1.5)), 0.08
                    )
                for _ in range(int(rng.integers(1, 4))):
                    parts += O.bush(
                        rng, x + rng.uniform(0, length), s * (e0 + rng.uniform(1.0, setback)), 0.08
                    )
            x += length
        else:
            gap = rng.uniform(4.0, 25.0)
            yf = s * (e0 + rng.uniform(0.3, 2.0))
            if rng.random() < 0.7:
                parts += O.fence(rng, x, yf, x + gap, yf, 0.08)
            elif rng.random() < 0.5:
                parts += O.hedge(rng, x, x + gap, yf, 0.08)
            for _ in range(int(rng.integers(1, 4))):
                parts += O.tree(rng, x + rng.uniform(0, gap), s * (e0 + rng.uniform(3, 12)), 0.08)
            for _ in range(int(rng.integers(0, 3))):
                parts += O.bush(rng, x + rng.uniform(0, gap), s * (e0 + rng.uniform(1, 10)), 0.08)
            x += gap
    return parts


def _sidewalk_things(rng, L, s, inner, width):
    parts = []
    z = SIDEWALK_TOP
    x = -L + rng.uniform(0, 10)
    while x < L:  # street lights / poles at the curb
        parts += O.pole(rng, x, s * (inner + 0.4), z)
        x += rng.uniform(12.0, 35.0)
    for _ in range(int(rng.integers(2, 7))):
        facing = rng.choice([0.0, np.pi]) if rng.random() < 0.7 else -s * np.pi / 2
        parts += O.traffic_sign(
            rng, rng.uniform(-40, 40), s * (inner + 0.5), facing + rng.uniform(-0.3, 0.3), z
        )
    if rng.random() < 0.75:
        x = -L + rng.uniform(0, 15)
        while x < L:
            parts += O.tree(rng, x, s * (inner + width * 0.6), z)
            x += rng.uniform(8.0, 20.0)
    for _ in range(int(rng.integers(1, 6))):
        parts += O.person(
            rng,
            rng.uniform(-35, 35),
            s * (inner + rng.uniform(0.8, width - 0.3)),
            rng.uniform(-np.pi, np.pi),
            z0=z,
        )
    for _ in range(int(rng.integers(0, 3))):
        parts += list(
            O.bicycle(rng, rng.uniform(-30, 30), s * (inner + width - 0.5), rng.uniform(-0.2, 0.2))
        )
    for p in parts:
        if p.cls == C.BICYCLE:  # parked bicycles stand on the sidewalk
            p.mesh.translate((0, 0, z))
    return parts


def build_scene(seed: int) -> Scene:
    """A deterministic street scene for seed (same seed -> same meshes)."""
    rng = np.random.default_rng(seed)
    L = 110.0
    lanes = int(rng.integers(2, 5))
    hw = lanes * LANE_W / 2
    parts = _road(rng, L, lanes, hw)
    sensor_lane = int(rng.integers(0, lanes))
    lane_y = [-hw + (k + 0.5) * LANE_W for k in range(lanes)]
    sensor_xy = (0.0, lane_y[sensor_lane])
    occ = _Lanes(lanes)
    occ.take(sensor_lane, 0.0, 3.0)
    for s in (1.0, -1.0):
        e = hw
        if rng.random() < 0.7:  # parking strip with parked cars / motorcycles
            pw = rng.uniform(2.3, 2.8)
            y0, y1 = sorted((s * e, s * (e + pw)))
            parts.append(_part(slab(-L, L, y0, y1, 0.0), C.PARKING, rng.uniform(0.15, 0.3)))
            yc, x = s * (e + pw / 2), -L + rng.uniform(0, 6)
            while x < L - 3:
                r = rng.random()
                if r < 0.55:
                    parts += O.car(rng, x, yc, rng.choice([0.0, np.pi]) + rng.normal(0, 0.03))
                elif r < 0.65:
                    parts += O.motorcycle(rng, x, yc, rng.uniform(0.8, 2.3))
                x += rng.uniform(5.2, 7.0)
            e += pw
        if rng.random() < 0.5:  # grass verge between the carriageway and the sidewalk
            vw = rng.uniform(1.0, 4.0)
            y0, y1 = sorted((s * e, s * (e + vw)))
            parts.append(
                _part(
                    slab(-L, L, y0, y1, rng.uniform(0.05, 0.2)), C.TERRAIN, rng.uniform(0.25, 0.45)
                )
            )
            if rng.random() < 0.5:
                x = -L + rng.uniform(0, 10)
                while x < L:
                    parts += O.tree(rng, x, s * (e + vw / 2), 0.1)
                    x += rng.uniform(7.0, 18.0)
            e += vw
        sw = rng.uniform(2.0, 5.0)
        y0, y1 = sorted((s * e, s * (e + sw)))
        parts.append(_part(slab(-L, L, y0, y1, SIDEWALK_TOP), C.SIDEWALK, rng.uniform(0.25, 0.4)))
        parts += _sidewalk_things(rng, L, s, e, sw)
        e += sw
        parts += _lot_zone(rng, L, s, e, 45.0)
        parts += _buildings(rng, L, s, e)
    # traffic: at least one of each moving kind, more cars
    kinds = (
        [O.car] * int(rng.integers(3, 12))
        + [O.truck] * int(rng.integers(1, 3))
        + [O.other_vehicle] * int(rng.integers(1, 3))
        + [O.bicyclist] * int(rng.integers(1, 3))
        + [O.motorcyclist] * int(rng.integers(1, 3))
    )
    half = {O.car: 2.5, O.truck: 5.0, O.other_vehicle: 6.0, O.bicyclist: 1.0, O.motorcyclist: 1.2}
    for make in kinds:
        for _ in range(20):
            lane = int(rng.integers(0, lanes))
            x = (
                rng.uniform(-45.0, 45.0)
                if make in (O.bicyclist, O.motorcyclist)
                else rng.uniform(-70.0, 70.0)
            )
            if occ.take(lane, x, half[make]):
                yaw = 0.0 if lane_y[lane] < 0 or lanes == 1 else np.pi
                y = lane_y[lane] + rng.uniform(-0.4, 0.4)
                if make is O.bicyclist:  # cyclists keep to the lane's right edge
                    y = lane_y[lane] + (1.1 if yaw else -1.1)
                parts += make(rng, x, y, yaw + rng.normal(0, 0.03))
                break
    return Scene(parts, sensor_xy, L)
