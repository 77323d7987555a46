"""Spinning LiDAR profiles and an Open3D ray-casting scanner."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import open3d as o3d

from synth import classes as C
from synth.scene import Scene


FOLIAGE_DEPTH = 0.3  # metres: mean extra range of a return from vegetation (exponential)


@dataclass(frozen=True)
class SensorProfile:
    name: str
    beams: int
    elev_max_deg: float
    elev_min_deg: float
    azimuth_step_deg: float
    mount_height: float = 1.73
    max_range: float = 120.0
    min_range: float = 1.0
    range_noise: float = 0.02  # metres, 1 sigma, along the ray
    dropout: float = 0.03  # fraction of returns lost at random
    intensity_scale: float = 1.0  # 1.0 -> intensity in 0..1, 255.0 -> 0..255

    @property
    def columns(self) -> int:
        return int(round(360.0 / self.azimuth_step_deg))

    def elevations_deg(self) -> np.ndarray:
        return np.linspace(self.elev_max_deg, self.elev_min_deg, self.beams)


HDL64 = SensorProfile("hdl64", 64, 2.0, -24.8, 0.17, mount_height=1.73, max_range=120.0)
NUSCENES32 = SensorProfile(
    "nuscenes32", 32, 10.0, -30.0, 0.33, mount_height=1.84, max_range=100.0, intensity_scale=255.0
)
OUSTER128 = SensorProfile(
    "ouster128",
    128,
    22.5,
    -22.5,
    360.0 / 1024,
    mount_height=1.8,
    max_range=100.0,
    range_noise=0.03,
    intensity_scale=255.0,
)
PROFILES = {p.name: p for p in (HDL64, NUSCENES32, OUSTER128)}


@dataclass
class MergedMesh:
    vertices: np.ndarray  # float32 [V,3]
    triangles: np.ndarray  # uint32 [T,3]
    cls: np.ndarray  # uint8 [T] training class per triangle
    raw: np.ndarray  # uint32 [T] raw SemanticKITTI id per triangle
    refl: np.ndarray  # float32 [T] material reflectivity per triangle


def merge(scene: Scene) -> MergedMesh:
    """All parts of a scene as one triangle soup with per-triangle labels."""
    verts, tris, cls, raw, refl = [], [], [], [], []
    base = 0
    for p in scene.parts:
        v = np.asarray(p.mesh.vertices)
        t = np.asarray(p.mesh.triangles)
        verts.append(v)
        tris.append(t + base)
        base += len(v)
        cls.append(np.full(len(t), p.cls, np.uint8))
        raw.append(np.full(len(t), p.raw, np.uint32))
        refl.append(np.full(len(t), p.refl, np.float32))
    return MergedMesh(
        np.concatenate(verts).astype(np.float32),
        np.concatenate(tris).astype(np.uint32),
        np.concatenate(cls),
        np.concatenate(raw),
        np.concatenate(refl),
    )


def ray_directions(profile: SensorProfile, az_offset_deg: float = 0.0) -> np.ndarray:
    """Unit directions [beams*columns, 3], beam-major (row = beam, column = azimuth)."""
    el = np.deg2rad(profile.elevations_deg())[:, None]
    az = np.deg2rad(az_offset_deg + np.arange(profile.columns) * profile.azimuth_step_deg)[None]
    ce = np.cos(el)
    d = np.stack(np.broadcast_arrays(ce * np.cos(az), ce * np.sin(az), np.sin(el)), -1)
    return d.reshape(-1, 3)


def scan(scene: Scene, profile: SensorProfile, rng: np.random.Generator):
    """Cast every beam of one revolution. Returns (points [N,4] float32 in the sensor frame,
    labels uint8 [N], raw labels uint32 [N]); misses, out-of-range and dropped returns are
    removed."""
    mm = merge(scene)
    rs = o3d.t.geometry.RaycastingScene()
    rs.add_triangles(o3d.core.Tensor(mm.vertices), o3d.core.Tensor(mm.triangles))
    origin = np.array([scene.sensor_xy[0], scene.sensor_xy[1], profile.mount_height], np.float32)
    dirs = ray_directions(profile, rng.uniform(0.0, profile.azimuth_step_deg)).astype(np.float32)
    rays = np.concatenate([np.broadcast_to(origin, dirs.shape), dirs], 1)
    ans = rs.cast_rays(o3d.core.Tensor(np.ascontiguousarray(rays)))
    t = ans["t_hit"].numpy()
    prim = ans["primitive_ids"].numpy()
    normals = ans["primitive_normals"].numpy()
    n = len(t)
    # draw every random number for every ray so the stream does not depend on the hit pattern
    noise = rng.normal(0.0, profile.range_noise, n).astype(np.float32)
    keep_draw = rng.random(n)
    inten_noise = rng.normal(0.0, 0.03, n).astype(np.float32)
    foliage = rng.exponential(FOLIAGE_DEPTH, n).astype(np.float32)
    hit = np.isfinite(t) & (t >= profile.min_range) & (t <= profile.max_range)
    keep = hit & (keep_draw >= profile.dropout)
    prim = prim[keep]
    # foliage is porous: a beam entering a crown or hedge returns from somewhere inside it
    depth = np.where(mm.cls[prim] == C.VEGETATION, foliage[keep], np.float32(0.0))
    t, normals, d = t[keep] + noise[keep] + depth, normals[keep], dirs[keep]
    xyz = d * t[:, None]
    cos_inc = np.abs(np.einsum("ij,ij->i", d, normals))
    atten = 1.0 - 0.35 * (t / profile.max_range)
    inten = np.clip(mm.refl[prim] * (0.25 + 0.75 * cos_inc) * atten + inten_noise[keep], 0, 1)
    pts = np.concatenate([xyz, (inten * profile.intensity_scale)[:, None]], 1).astype(np.float32)
    return pts, mm.cls[prim].copy(), mm.raw[prim].copy()


__all__ = [
    "SensorProfile",
    "HDL64",
    "NUSCENES32",
    "OUSTER128",
    "PROFILES",
    "scan",
    "ray_directions",
    "merge",
    "C",
]
