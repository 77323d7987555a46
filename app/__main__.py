"""`python -m app`: until the HTTP service exists, a demonstration on a real LiDAR frame.

Voxelizes a frame, builds the kernel maps of an encoder-decoder of sparse layers, runs it, and
prints the per-stage timing and map statistics."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from models import (BatchNorm, ReLU, SparseConv3d, SparseInverseConv3d, SparseTensor,
                    SubMConv3d, cat)

DEFAULT_FRAME = (Path(__file__).resolve().parents[2] / "shared" / "data" / "real" / "semantickitti"
                 / "seq00_000000.bin")


def voxelize(points: np.ndarray, voxel_size: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique voxels (batch 0) and the mean of each voxel's point features."""
    grid = torch.from_numpy(np.floor(points[:, :3] / voxel_size).astype(np.int32))
    voxels, inverse = torch.unique(grid, dim=0, return_inverse=True)
    feats = torch.zeros(len(voxels), points.shape[1]).index_add_(0, inverse, torch.from_numpy(points))
    feats /= torch.bincount(inverse, minlength=len(voxels)).unsqueeze(1)
    coords = torch.cat([torch.zeros(len(voxels), 1, dtype=torch.int32), voxels], 1)
    return feats, coords.contiguous()


class TinyUNet(nn.Module):
    """Two levels: enough to exercise submanifold, strided and inverse maps."""

    def __init__(self, cin: int, width: int = 32):
        super().__init__()
        self.stem = nn.Sequential(SubMConv3d(cin, width), BatchNorm(width), ReLU())
        self.down = nn.Sequential(SparseConv3d(width, 2 * width), BatchNorm(2 * width), ReLU(),
                                  SubMConv3d(2 * width, 2 * width), BatchNorm(2 * width), ReLU())
        self.up = SparseInverseConv3d(2 * width, width)
        self.head = SubMConv3d(2 * width, width, kernel_size=1)

    def forward(self, x: SparseTensor) -> SparseTensor:
        skip = self.stem(x)
        return self.head(cat(self.up(self.down(skip)), skip))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("frame", nargs="?", default=str(DEFAULT_FRAME), help="KITTI .bin frame")
    parser.add_argument("--voxel", type=float, default=0.05)
    args = parser.parse_args(argv)
    points = np.fromfile(args.frame, dtype=np.float32).reshape(-1, 4)
    torch.manual_seed(0)
    model = TinyUNet(4).eval()
    with torch.no_grad():
        model(SparseTensor(*voxelize(points[:2000], args.voxel)))  # warm-up: builds the kernels
        t0 = time.perf_counter()
        feats, coords = voxelize(points, args.voxel)
        t1 = time.perf_counter()
        x = SparseTensor(feats, coords)
        x.manager.submanifold_map(1, 3)
        x.manager.downsample(1, 2, 2)
        x.manager.submanifold_map(2, 3)
        t2 = time.perf_counter()
        out = model(x)
        t3 = time.perf_counter()
    kmap = x.manager.submanifold_map(1, 3)
    print(f"frame: {args.frame}")
    print(f"points: {len(points)}  voxels: {len(coords)}  coarse voxels: "
          f"{len(x.manager.coords(2))}  output: {tuple(out.feats.shape)}")
    print(f"submanifold map: {sum(kmap.counts)} entries, counts {kmap.counts}")
    print(f"timing_ms: voxelize {1e3 * (t1 - t0):.1f}  maps {1e3 * (t2 - t1):.1f}  "
          f"network {1e3 * (t3 - t2):.1f}  (threads: {torch.get_num_threads()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
