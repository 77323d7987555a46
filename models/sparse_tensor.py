"""SparseTensor: features on integer voxel coordinates, with the kernel maps of its levels cached.

Coordinates are int32 [N, 4] as (batch, x, y, z) in the tensor's own grid: after a stride-2
downsample the grid is twice as coarse and coordinates are floor(c / 2). Coordinates may be
negative and no spatial shape is needed, so no voxel is ever dropped at a grid edge.

Every tensor derived from one input (by convolutions, norms, activations, concatenation) shares
one CoordinateManager. It caches per level (tensor stride) the coordinates, their hash table
(built only for maps that look coordinates up: not the CPU kernel-3 submanifold maps, nor kernel
== stride downsampling), the submanifold maps per (kernel size, dilation), and the downsampling
maps, so every layer at a level reuses them without user-managed keys, and an inverse
convolution finds the map to invert. Maps build fastest on coordinates in ascending (batch, x,
y, z) order, which is the order the service's voxelizer produces; any order gives the same maps.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import Executor
from dataclasses import dataclass

import torch

from kernels import CoordHashTable, KernelMap, downsample, openmp, submanifold_map
from kernels.downsampling import downsample_needs_table
from kernels.kmap import submanifold_needs_table
from kernels.engine import EngineConfig


@dataclass(frozen=True)
class MapRequest:
    """One kernel map a network uses: kind "submanifold" (`step` is the dilation),
    "downsample" (level `stride` -> `stride * step`) or "upsample" (the transposed map of the
    downsampling that made level `stride`)."""

    kind: str
    stride: int
    kernel_size: int
    step: int = 1


@dataclass(frozen=True)
class Downsampling:
    fine_stride: int
    kernel_size: int
    stride: int
    kmap: KernelMap  # fine rows -> coarse rows


class CoordinateManager:
    """The coordinate levels of one input and their cached maps."""

    def __init__(self, engine: EngineConfig | None = None):
        self.engine = engine or EngineConfig()
        self._coords: dict[int, torch.Tensor] = {}
        self._tables: dict[int, CoordHashTable] = {}
        self._submanifold: dict[tuple[int, int, int], KernelMap] = {}
        self._downsampling: dict[tuple[int, int, int], Downsampling] = {}
        self._parent: dict[int, Downsampling] = {}  # coarse stride -> how it was made

    def add_level(self, stride: int, coords: torch.Tensor) -> None:
        if stride in self._coords and self._coords[stride] is not coords:
            raise ValueError(f"tensor stride {stride} already has other coordinates")
        self._coords[stride] = coords

    def coords(self, stride: int) -> torch.Tensor:
        return self._coords[stride]

    def table(self, stride: int) -> CoordHashTable:
        if stride not in self._tables:
            self._tables[stride] = CoordHashTable.build(self._coords[stride])
        return self._tables[stride]

    def submanifold_map(self, stride: int, kernel_size: int, dilation: int = 1) -> KernelMap:
        key = (stride, kernel_size, dilation)
        if key not in self._submanifold:
            coords = self._coords[stride]
            table = (
                self.table(stride)
                if submanifold_needs_table(coords.device, kernel_size, dilation)
                else None
            )
            self._submanifold[key] = submanifold_map(coords, table, kernel_size, dilation)
        return self._submanifold[key]

    def downsample(self, stride: int, kernel_size: int, step: int) -> Downsampling:
        """Map from level `stride` to level `stride * step` (built once, then reused)."""
        key = (stride, kernel_size, step)
        if key not in self._downsampling:
            coarse_stride = stride * step
            table = self.table(stride) if downsample_needs_table(kernel_size, step) else None
            out_coords, out_table, kmap = downsample(self._coords[stride], table, kernel_size, step)
            if coarse_stride in self._coords:
                raise ValueError(
                    f"level {coarse_stride} already exists; a second downsampling to it with "
                    f"kernel {kernel_size} would give it other coordinates"
                )
            self._coords[coarse_stride] = out_coords
            if out_table is not None:  # else built when a map first needs it
                self._tables[coarse_stride] = out_table
            made = Downsampling(stride, kernel_size, step, kmap)
            self._downsampling[key] = made
            self._parent[coarse_stride] = made
        return self._downsampling[key]

    def prepare(self, requests, helper: Executor | None = None) -> None:
        """Builds every map in `requests` (MapRequests) now, so the layers find them cached:
        the pipeline's maps stage, ahead of the network. With `helper` (an executor whose one
        thread runs its kernels on one OpenMP thread: kernels/openmp.py), two threads build at
        once, each on one core: the helper makes the downsamplings (each level's coordinates),
        then both take the other maps from one queue (_MapQueue), each the first that can be
        built. Most maps scale poorly over two threads (a KITTI frame's downsamplings not at
        all), so two single-threaded builders finish sooner than one on two threads."""
        if helper is None:
            self._build(requests)
            return
        downsamplings = [r for r in requests if r.kind == "downsample"]
        queue = _MapQueue(self, [r for r in requests if r.kind != "downsample"])

        def chain() -> None:
            with queue.stopping_on_error():
                for r in downsamplings:
                    self._build([r])
                    queue.level_made()
                queue.all_levels_made()
                self._build_from(queue)

        done = helper.submit(chain)
        try:
            with openmp.threads_here(1), queue.stopping_on_error():
                self._build_from(queue)
        finally:
            done.result()

    def _build_from(self, queue: _MapQueue) -> None:
        while (request := queue.take()) is not None:
            self._build([request])

    def _build(self, requests) -> None:
        for r in requests:
            if r.kind == "submanifold":
                self.submanifold_map(r.stride, r.kernel_size, r.step)
            elif r.kind == "downsample":
                self.downsample(r.stride, r.kernel_size, r.step)
            elif r.kind == "upsample":
                self.upsample(r.stride, r.kernel_size).kmap.transposed  # noqa: B018 (cached)
            else:
                raise ValueError(f"unknown map request kind {r.kind!r}")

    def built(self) -> dict[str, list]:
        """What is cached: submanifold maps, downsamplings, their transposed maps, and the
        strides of the levels that have a hash table."""
        return {
            "submanifold": sorted(self._submanifold),
            "downsample": sorted(self._downsampling),
            "transposed": sorted(
                k for k, d in self._downsampling.items() if "transposed" in vars(d.kmap)
            ),
            "tables": sorted(self._tables),
        }

    def upsample(self, stride: int, kernel_size: int) -> Downsampling:
        """The downsampling that produced level `stride`, to be inverted."""
        made = self._parent.get(stride)
        if made is None:
            raise ValueError(f"no downsampling produced tensor stride {stride}: nothing to invert")
        if made.kernel_size != kernel_size:
            raise ValueError(
                f"level {stride} was made with kernel {made.kernel_size}, "
                f"the inverse convolution has kernel {kernel_size}"
            )
        return made


class _MapQueue:
    """The maps left to build once the downsamplings are under way, taken by two threads:
    submanifold maps finest level first (the largest, so the longest go first) once their
    level exists, then the upsamplings (and anything else) once every level is made. take()
    waits while nothing can be built yet; None when the queue is empty or a builder failed."""

    def __init__(self, manager: CoordinateManager, requests) -> None:
        order = {"submanifold": 0, "upsample": 1}
        self._manager = manager
        self._pending = sorted(
            requests, key=lambda r: (order.get(r.kind, 2), r.stride, -r.kernel_size)
        )
        self._changed = threading.Condition()
        self._levels_made = False
        self._stopped = False

    def _ready(self, r: MapRequest) -> bool:
        if r.kind == "submanifold" and r.stride in self._manager._coords:
            return True
        return self._levels_made

    def take(self) -> MapRequest | None:
        with self._changed:
            while self._pending and not self._stopped:
                for i, r in enumerate(self._pending):
                    if self._ready(r):
                        return self._pending.pop(i)
                self._changed.wait()
            return None

    def level_made(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def all_levels_made(self) -> None:
        with self._changed:
            self._levels_made = True
            self._changed.notify_all()

    @contextlib.contextmanager
    def stopping_on_error(self) -> Iterator[None]:
        """Within: an error stops both builders (the other one returns from take())."""
        try:
            yield
        except BaseException:
            with self._changed:
                self._stopped = True
                self._changed.notify_all()
            raise


class SparseTensor:
    """feats float [N, C] on coords int32 [N, 4] (batch, x, y, z)."""

    def __init__(
        self,
        feats: torch.Tensor,
        coords: torch.Tensor,
        stride: int = 1,
        manager: CoordinateManager | None = None,
        engine: EngineConfig | None = None,
    ):
        if coords.dtype != torch.int32 or coords.dim() != 2 or coords.shape[1] != 4:
            raise ValueError(
                f"coords must be int32 [N, 4], got {coords.dtype} {tuple(coords.shape)}"
            )
        _check_feats(feats, coords)
        self.feats = feats
        self.coords = coords
        self.stride = stride
        self.manager = manager or CoordinateManager(engine)
        self.manager.add_level(stride, coords)

    @property
    def engine(self) -> EngineConfig:
        return self.manager.engine

    def replace_feats(self, feats: torch.Tensor) -> "SparseTensor":
        """Same coordinates and maps, new features (row for row). The coordinates and their
        level were checked when this tensor was made: only the features are (every layer of a
        network makes one of these)."""
        _check_feats(feats, self.coords)
        out = SparseTensor.__new__(SparseTensor)
        out.feats, out.coords, out.stride, out.manager = (
            feats,
            self.coords,
            self.stride,
            self.manager,
        )
        return out

    def __len__(self) -> int:
        return self.coords.shape[0]

    def __repr__(self) -> str:
        return (
            f"SparseTensor(n={len(self)}, channels={self.feats.shape[1]}, "
            f"stride={self.stride}, device={self.feats.device})"
        )


def _check_feats(feats: torch.Tensor, coords: torch.Tensor) -> None:
    """feats must be [N, C] on coords' device, one row per coordinate."""
    if feats.dim() != 2 or feats.shape[0] != coords.shape[0]:
        raise ValueError(f"feats must be [{coords.shape[0]}, C], got {tuple(feats.shape)}")
    if feats.device != coords.device:
        raise ValueError(f"feats on {feats.device} but coords on {coords.device}")
