"""Shared helpers for the tests: real LiDAR frames, voxelisation, thread control, spconv.

The real frames live outside the repository, in `shared/data/real/` beside the repo root (CI
clones the repo to another folder with a copy of `shared/` next to it). They are read in place
and never copied into the repository.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
REAL_DATA = REPO_ROOT.parent / "shared" / "data" / "real"

# (path relative to REAL_DATA, float32 fields per point)
FRAMES: list[tuple[str, int]] = [
    ("semantickitti/seq00_000000.bin", 4),
    ("semantickitti/spvnas_000000.bin", 4),
    ("semantickitti/seq00_000000_subset50.bin", 4),
    ("nuscenes/n015-2018-07-24-11-22-45+0800__LIDAR_TOP__1532402927647951.pcd.bin", 5),
    ("ouster/os1-128_lb_n3_scan0_xyzr.bin", 4),
]
FIELDS = dict(FRAMES)


def frame_id(name: str) -> str:
    """A short pytest id for a frame file: 'semantickitti/seq00_000000.bin' -> 'seq00_000000'."""
    stem = Path(name).name.split(".")[0]
    return "nuscenes" if name.startswith("nuscenes/") else stem


def run_app(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m app ARGS` as a user runs it, from the repository root; exit status 0."""
    out = subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr
    return out


def last_json_line(text: str) -> dict:
    """The JSON object a command prints as its last line (evaluate, client --repeat)."""
    return json.loads(text.strip().splitlines()[-1])


def require_real_data() -> Path:
    """REAL_DATA, or skip the calling test when the folder is missing."""
    if not REAL_DATA.is_dir():
        pytest.skip(
            f"real LiDAR frames not found: expected the folder {REAL_DATA} "
            "(shared/data/real beside the repository root)"
        )
    return REAL_DATA


@functools.lru_cache(maxsize=None)
def _load(name: str) -> np.ndarray:
    path = require_real_data() / name
    if not path.is_file():
        pytest.skip(f"real LiDAR frame missing: {path}")
    pts = np.fromfile(path, dtype=np.float32)
    fields = FIELDS[name]
    if pts.size % fields:
        raise ValueError(f"{path}: {pts.size} floats is not a multiple of {fields} fields")
    pts = pts.reshape(-1, fields)
    pts.flags.writeable = False
    return pts


def load_frame(name: str) -> np.ndarray:
    """float32 [N, F]: x, y, z, then the frame's other fields (read-only array)."""
    return _load(name)


def voxelize(points: np.ndarray, voxel_size: float, batch: int = 0) -> torch.Tensor:
    """int32 [M, 4] (batch, x, y, z): the unique floor(xyz / voxel_size), sorted (deterministic)."""
    xyz = torch.from_numpy(
        np.floor(np.asarray(points)[:, :3] / np.float32(voxel_size)).astype(np.int64)
    )
    xyz = torch.unique(xyz, dim=0)  # sorted lexicographically
    b = torch.full((xyz.shape[0], 1), batch, dtype=torch.int64)
    return torch.cat([b, xyz], dim=1).to(torch.int32).contiguous()


@functools.lru_cache(maxsize=None)
def voxelized_frame(name: str, voxel_size: float) -> torch.Tensor:
    """Cached voxelize(load_frame(name), voxel_size); do not modify the result in place."""
    return voxelize(load_frame(name), voxel_size)


from models.spconv_twin import num_threads  # noqa: E402  (one thread-count context manager)

# Devices our kernels run on here: every device-parametrised test runs on the CPU and, where torch
# sees a GPU, on CUDA (skipped cleanly otherwise; the GPU check selects them with -k cuda).
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
    ),
]


def single_thread():
    """spconv's CPU path is only correct single-threaded (spconv issue #679): wrap every spconv
    call that serves as a reference in `with single_thread():`."""
    return num_threads(1)


def ours_threads():
    """Our engine must be right with any thread count: run it with two threads."""
    return num_threads(2)


@pytest.fixture(scope="session")
def spconv():
    """spconv.pytorch, or skip."""
    return pytest.importorskip("spconv.pytorch")


# ---- spconv interop helpers -----------------------------------------------------------------


def spconv_grid(coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(shifted coords, shift [3], spatial_shape) for spconv, which needs coordinates in
    [0, spatial_shape). The shift is a multiple of 8 so that floor(c / 2) stays consistent over
    three stride-2 levels; the spatial shape is rounded up to a multiple of 8 so that a stride-2
    conv with kernel 2 keeps every coarse voxel (an odd shape would drop the last plane)."""
    xyz = coords[:, 1:].to(torch.int64)
    lo = xyz.min(0).values if len(xyz) else torch.zeros(3, dtype=torch.int64)
    shift = -torch.div(lo, 8, rounding_mode="floor") * 8
    shifted = coords.clone()
    shifted[:, 1:] = (xyz + shift).to(torch.int32)
    hi = (xyz + shift).max(0).values if len(xyz) else torch.zeros(3, dtype=torch.int64)
    shape = ((hi + 1 + 7) // 8 * 8).tolist()
    return shifted.contiguous(), shift, shape


def coord_keys(coords: torch.Tensor) -> torch.Tensor:
    """int64 key per row of int32 (batch, x, y, z), injective for |x|, |y|, |z| < 2**17 and
    batch < 2**10."""
    c = coords.to(torch.int64)
    off = 1 << 17
    return (
        ((c[:, 0] * (1 << 18) + c[:, 1] + off) * (1 << 18) + c[:, 2] + off) * (1 << 18)
        + c[:, 3]
        + off
    )


def match_rows(ours: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """perm with ours[perm] == ref row for row; asserts both hold the same unique coordinate set."""
    ko, kr = coord_keys(ours), coord_keys(ref)
    assert ko.shape == kr.shape, f"{len(ko)} rows vs {len(kr)} reference rows"
    so, po = torch.sort(ko)
    sr, pr = torch.sort(kr)
    assert torch.equal(so, sr), "coordinate sets differ"
    assert bool((so[1:] != so[:-1]).all()), "duplicate coordinates"
    perm = torch.empty_like(po)
    perm[pr] = po
    return perm


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref| (0 for two empty or all-zero tensors)."""
    out, ref = out.detach().double(), ref.detach().double()
    assert out.shape == ref.shape, f"{tuple(out.shape)} vs {tuple(ref.shape)}"
    if ref.numel() == 0:
        return 0.0
    scale = ref.abs().max().item()
    diff = (out - ref).abs().max().item()
    return diff / scale if scale > 0 else diff


def randomize_batchnorm(model: torch.nn.Module, batches: int = 5) -> torch.nn.Module:
    """Non-trivial BN affine parameters and running statistics (so every BN is a real
    per-channel affine map in eval mode), in place; returns the model."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 2.0)
                m.num_batches_tracked.fill_(batches)
    return model
