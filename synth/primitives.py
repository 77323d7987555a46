"""Mesh primitives (legacy Open3D triangle meshes) and the labelled Part record."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import open3d as o3d


@dataclass
class Part:
    """One mesh of the scene with its training class, raw SemanticKITTI id and reflectivity."""

    mesh: o3d.geometry.TriangleMesh
    cls: int
    raw: int
    refl: float


def _yaw(yaw: float) -> np.ndarray:
    c, s = np.cos(yaw), np.sin(yaw)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def place(mesh: o3d.geometry.TriangleMesh, center, yaw: float = 0.0):
    """Rotate a mesh (built around the origin) by yaw about z, then move it to center."""
    if yaw:
        mesh.rotate(_yaw(yaw), center=(0.0, 0.0, 0.0))
    mesh.translate(np.asarray(center, dtype=np.float64))
    return mesh


def box(center, size, yaw: float = 0.0) -> o3d.geometry.TriangleMesh:
    """Axis box of size (sx, sy, sz) centred at center, turned by yaw about z."""
    sx, sy, sz = (float(v) for v in size)
    m = o3d.geometry.TriangleMesh.create_box(sx, sy, sz)
    m.translate((-sx / 2, -sy / 2, -sz / 2))
    return place(m, center, yaw)


def slab(x0, x1, y0, y1, top, depth=0.3) -> o3d.geometry.TriangleMesh:
    """A ground slab covering [x0,x1] x [y0,y1] whose upper face is at z = top."""
    return box(((x0 + x1) / 2, (y0 + y1) / 2, top - depth / 2), (x1 - x0, y1 - y0, depth))


def cylinder(
    center, radius, height, axis: str = "z", yaw: float = 0.0, resolution: int = 10
) -> o3d.geometry.TriangleMesh:
    """Closed cylinder centred at center along z (or along the local x/y axis, then yawed)."""
    m = o3d.geometry.TriangleMesh.create_cylinder(
        float(radius), float(height), resolution=resolution, split=1
    )
    if axis == "y":
        m.rotate(o3d.geometry.get_rotation_matrix_from_xyz((np.pi / 2, 0, 0)), center=(0, 0, 0))
    elif axis == "x":
        m.rotate(o3d.geometry.get_rotation_matrix_from_xyz((0, np.pi / 2, 0)), center=(0, 0, 0))
    return place(m, center, yaw)


def ellipsoid(center, radii, resolution: int = 6) -> o3d.geometry.TriangleMesh:
    """Unit sphere scaled per axis to radii (rx, ry, rz), centred at center."""
    m = o3d.geometry.TriangleMesh.create_sphere(1.0, resolution=resolution)
    v = np.asarray(m.vertices) * np.asarray(radii, dtype=np.float64)
    m.vertices = o3d.utility.Vector3dVector(v)
    return place(m, center)
