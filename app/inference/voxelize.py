"""Points -> voxels with Open3D's tensor HashSet (its HashMap without values), and back.

Every input point is accounted for: a point is either in a voxel or ignored (non-finite, or
outside the configured range) and counted as such. Voxels are in ascending (batch, x, y, z)
order, so the same frame always gives the same voxels in the same order, whatever order Open3D's
parallel insert visits them in; it is also the order in which kernel maps build fastest (merge
joins instead of hash probes, kernels/csrc/sorted_kmap_cpu.cpp), and downsampling keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch

from models.checkpoints import INTENSITY_NORMALISATION, intensity_scales
from models.labels import IGNORE_LABEL

o3c: ModuleType | None
try:  # Open3D is the voxelizer; hosts without it (a bare GPU box) fall back to torch.unique
    import open3d.core as o3c
except ImportError:  # pragma: no cover - exercised only where Open3D is missing
    o3c = None

# sensor -> intensity factor of our checkpoint format's default normalisation
INTENSITY_SCALE = intensity_scales(INTENSITY_NORMALISATION)
FEATURE_COLUMNS = {"x": 0, "y": 1, "z": 2, "intensity": 3}


@dataclass(frozen=True)
class VoxelizeConfig:
    voxel_size: float = 0.05
    features: tuple[str, ...] = ("x", "y", "z", "intensity")
    max_xy: float = 120.0  # metres from the sensor, per axis
    z_range: tuple[float, float] = (-20.0, 20.0)
    # (sensor, factor) pairs: intensity * factor is the feature (a checkpoint's
    # intensity_normalisation, app/inference/builder.py); sensors not listed use 1.0
    intensity_scale: tuple[tuple[str, float], ...] = tuple(INTENSITY_SCALE.items())

    def __post_init__(self):
        if self.voxel_size <= 0:
            raise ValueError(f"voxel_size must be positive, got {self.voxel_size}")
        unknown = set(self.features) - set(FEATURE_COLUMNS)
        if unknown:
            raise ValueError(
                f"unknown input features {sorted(unknown)}; known: {list(FEATURE_COLUMNS)}"
            )


@dataclass
class VoxelBatch:
    coords: torch.Tensor  # int32 [M, 4] (batch, x, y, z)
    feats: torch.Tensor  # float32 [M, F]: mean of the voxel's point features
    point_to_voxel: list[torch.Tensor]  # per frame, int64 [N_i]: voxel row, -1 if ignored
    ignored: list[dict[str, int]]  # per frame: {"non_finite": .., "out_of_range": ..}


def point_features(points: np.ndarray, config: VoxelizeConfig, sensor: str) -> np.ndarray:
    """[N, F] float32 input features, intensity scaled to 0..1 for the sensor."""
    if points.ndim != 2 or points.shape[1] < 3:
        raise ValueError(f"points must be [N, >=3], got {points.shape}")
    wanted = [FEATURE_COLUMNS[name] for name in config.features]
    scale = np.float32(dict(config.intensity_scale).get(sensor, 1.0))
    if wanted == list(range(len(wanted))) and len(wanted) <= points.shape[1]:
        out = np.array(
            points[:, : len(wanted)], dtype=np.float32
        )  # one copy of the leading columns
        if "intensity" in config.features:
            out[:, FEATURE_COLUMNS["intensity"]] *= scale
        return out
    cols = []
    for name in config.features:
        col = FEATURE_COLUMNS[name]
        if col >= points.shape[1]:
            if name == "intensity":  # xyz-only input: a constant intensity
                cols.append(np.zeros(len(points), np.float32))
                continue
            raise ValueError(f"feature {name!r} needs column {col}, points have {points.shape[1]}")
        value = points[:, col].astype(np.float32)
        if name == "intensity":
            value = value * scale
        cols.append(value)
    return np.stack(cols, axis=1)


def valid_mask(points: np.ndarray, config: VoxelizeConfig) -> tuple[np.ndarray, dict[str, int]]:
    finite = np.isfinite(points[:, :3]).all(axis=1)
    with np.errstate(invalid="ignore"):
        inside = (
            (np.abs(points[:, 0]) <= config.max_xy)
            & (np.abs(points[:, 1]) <= config.max_xy)
            & (points[:, 2] >= config.z_range[0])
            & (points[:, 2] <= config.z_range[1])
        )
    keep = finite & inside
    return keep, {"non_finite": int((~finite).sum()), "out_of_range": int((finite & ~inside).sum())}


Valid = tuple[np.ndarray, dict[str, int]]  # valid_mask's (keep mask, ignored counts)


def voxelize(
    frames: list[np.ndarray],
    config: VoxelizeConfig,
    sensor: str | list[str] = "kitti",
    device: torch.device = torch.device("cpu"),
    valid: list[Valid | None] | None = None,
) -> VoxelBatch:
    """Voxelize several frames as one batch (batch index = position in `frames`); `sensor` is one
    name for all frames or one per frame (it sets the intensity scale). `valid`: per frame the
    valid_mask result the caller already has (None: computed here), so it runs once per frame."""
    sensors = [sensor] * len(frames) if isinstance(sensor, str) else list(sensor)
    if len(sensors) != len(frames):
        raise ValueError(f"{len(frames)} frames but {len(sensors)} sensor names")
    grids, feats, masks, ignored = [], [], [], []
    known: list[Valid | None] = list(valid) if valid is not None else [None] * len(frames)
    if len(known) != len(frames):
        raise ValueError(f"{len(frames)} frames but {len(known)} validity masks")
    for points, frame_sensor, given in zip(frames, sensors, known):
        keep, counts = given if given is not None else valid_mask(points, config)
        ignored.append(counts)
        all_kept = bool(keep.all())
        masks.append(None if all_kept else keep)
        kept = points if all_kept else points[keep]
        cells = kept[:, :3] / np.float32(config.voxel_size)
        np.floor(cells, out=cells)
        grids.append(cells.astype(np.int32))
        feats.append(point_features(kept, config, frame_sensor))
    all_feats = np.concatenate(feats) if feats else np.zeros((0, len(config.features)), np.float32)
    voxel_of_point, coords = _unique_rows(grids)
    vfeats = _voxel_means(voxel_of_point.numpy(), all_feats, len(coords))
    point_to_voxel, start = [], 0
    for grid, mask in zip(grids, masks):
        ids = voxel_of_point[start : start + len(grid)]
        start += len(grid)
        if mask is None:  # every point in a voxel: the ids are the mapping
            point_to_voxel.append(ids)
            continue
        mapping = torch.full((len(mask),), -1, dtype=torch.int64)
        mapping[torch.from_numpy(np.flatnonzero(mask))] = ids
        point_to_voxel.append(mapping)
    return VoxelBatch(coords.to(device), vfeats.to(device), point_to_voxel, ignored)


def _voxel_means(voxel_of_point: np.ndarray, feats: np.ndarray, num_voxels: int) -> torch.Tensor:
    """float32 [M, F] mean feature of each voxel's points: one single-threaded bincount per
    column (sums in float64), steady on a busy machine where a parallel index_add_ is not."""
    counts = np.maximum(np.bincount(voxel_of_point, minlength=num_voxels), 1)
    out = np.empty((num_voxels, feats.shape[1]), dtype=np.float32)
    for j in range(feats.shape[1]):
        out[:, j] = np.bincount(voxel_of_point, weights=feats[:, j], minlength=num_voxels) / counts
    return torch.from_numpy(out)


def _unique_rows(grids: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """(voxel id of every point, int32 [M, 4] distinct (batch, x, y, z) in ascending order) for
    the int32 [N_b, 3] grid cells of each frame b: Open3D's tensor hash set finds the distinct
    cells, ids follow the ascending key order.

    Each cell is hashed as one packed 64-bit key (batch 12 bits, x, y, z 17 bits each, shifted to
    their minimum) seen by Open3D as two int32 (its int64 keys are an order of magnitude slower
    on the CPU); a run of equal keys (LiDAR points in scan order often repeat a voxel) is hashed
    once; only the M distinct keys are sorted, not the N points."""
    cells = np.concatenate(grids) if grids else np.zeros((0, 3), np.int32)
    if len(cells) == 0:
        return torch.zeros(0, dtype=torch.int64), torch.zeros(0, 4, dtype=torch.int32)
    lo = np.concatenate([[0], cells.min(axis=0)]).astype(np.int64)
    span = cells.max(axis=0).astype(np.int64) - lo[1:]
    if o3c is None or len(grids) > 2**12 or span.max() >= 2**17:
        # no Open3D, or beyond 12 + 3 x 17 bits: torch.unique sorts its rows, the inverse follows
        rows = np.concatenate(
            [np.column_stack([np.full(len(g), b, np.int32), g]) for b, g in enumerate(grids)]
        )
        coords, inverse = torch.unique(torch.from_numpy(rows), dim=0, return_inverse=True)
        return inverse, coords
    shifted = cells - cells.min(axis=0)
    packed = (
        shifted[:, 0].astype(np.int64) << 34 | shifted[:, 1].astype(np.int64) << 17 | shifted[:, 2]
    )
    start = 0
    for b, grid in enumerate(grids):
        packed[start : start + len(grid)] |= b << 51
        start += len(grid)
    head = np.empty(len(packed), dtype=bool)  # first point of each run of equal keys
    head[0] = True
    np.not_equal(packed[1:], packed[:-1], out=head[1:])
    heads = packed[head]
    as_pairs = o3c.Tensor(heads.view(np.int32).reshape(-1, 2))
    table = o3c.HashSet(len(heads), key_dtype=o3c.int32, key_element_shape=(2,))
    inserted_slot, inserted = table.insert(as_pairs)  # inserted: a key's first occurrence
    first = inserted.numpy()
    slot = inserted_slot.numpy()  # valid where inserted; a repeated key is looked up below
    repeats = np.flatnonzero(~first)
    if len(repeats):
        again = o3c.Tensor(np.ascontiguousarray(heads[repeats]).view(np.int32).reshape(-1, 2))
        repeat_slot, found = table.find(again)
        if not bool(found.numpy().all()):
            raise RuntimeError("Open3D HashSet lost a key it had just inserted")
        slot[repeats] = repeat_slot.numpy()
    distinct, distinct_slot = heads[first], slot[first]
    order = np.argsort(distinct)
    rank = np.empty(int(distinct_slot.max()) + 1, dtype=np.int64)
    rank[distinct_slot[order]] = np.arange(len(order))
    voxel_of_point = rank[slot][np.cumsum(head) - 1]
    sorted_keys = distinct[order]
    coords = np.empty((len(order), 4), dtype=np.int32)
    for axis in range(3, -1, -1):  # unpack z, y, x, batch
        coords[:, axis] = (sorted_keys & (2**17 - 1)) + lo[axis]
        sorted_keys = sorted_keys >> 17
    return torch.from_numpy(voxel_of_point), torch.from_numpy(coords)


def devoxelize(
    voxel_labels: torch.Tensor, point_to_voxel: torch.Tensor, ignore_label: int = IGNORE_LABEL
) -> np.ndarray:
    """Per-point labels (uint8) from per-voxel labels; ignored points get ignore_label."""
    labels = torch.full((len(point_to_voxel),), ignore_label, dtype=torch.uint8)
    inside = point_to_voxel >= 0
    labels[inside] = voxel_labels.cpu()[point_to_voxel[inside]].to(torch.uint8)  # no-op on host
    return labels.numpy()
