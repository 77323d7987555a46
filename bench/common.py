"""Shared helpers of the benchmarks: real frames, voxelization, timing, thread control, spconv.

Frames are read in place from the shared data folder (repo_root.parent/shared/data/real, or
--data); nothing is copied into the repository.

Threads: our CPU kernels are linked against libgomp.so.1, which resolves to the OpenMP runtime
torch already loaded, so torch.set_num_threads governs our kernels and every torch.mm. The spconv
CPU wheel bundles its own renamed OpenMP runtime (spconv.libs/libgomp-*.so); `set_threads` sets
that one too (through its omp_set_num_threads), so both sides of a comparison run with the same
thread count. spconv's CPU path is only correct single-threaded (spconv issue #679): its
multi-threaded figures are timings only.
"""

from __future__ import annotations

import ctypes
import glob
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from app.codecs import files

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "real"

# name -> (path under the data folder, float32 columns per point)
FRAMES = {
    "kitti00": ("semantickitti/seq00_000000.bin", 4),
    "kitti-spvnas": ("semantickitti/spvnas_000000.bin", 4),
    "nuscenes": ("nuscenes/n015-2018-07-24-11-22-45+0800__LIDAR_TOP__1532402927647951.pcd.bin", 5),
    "ouster128": ("ouster/os1-128_lb_n3_scan0_xyzr.bin", 4),
}
DEFAULT_FRAMES = ("kitti00", "nuscenes", "ouster128")
# the sensor (intensity convention) of the named frames that are not KITTI's
SENSOR = {"nuscenes": "nuscenes", "ouster128": "ouster"}


def sensor_of(name: str) -> str:
    """The sensor (intensity convention) a frame is read with: SENSOR's for a short name, else
    what a file's name says (app/codecs/files.py: nuScenes, Ouster, else KITTI). The service's
    raw float32 format of the same name reads it the same way (app/codecs/binary.py LAYOUTS):
    `/v1/segment?format={sensor_of(name)}`."""
    if name in SENSOR:
        return SENSOR[name]
    by_name = files.infer_format(Path(name))
    return by_name if by_name in SENSOR.values() else "kitti"


@dataclass
class Frame:
    name: str
    points: np.ndarray  # float32 [N, C], xyz first


def _columns_for(path: Path) -> int:
    return 5 if path.name.endswith(".pcd.bin") else 4


def load_frame(name_or_path: str, data: Path | None = None) -> Frame:
    """A frame by short name (FRAMES) or by path (absolute, or relative to the data folder).
    nuScenes .pcd.bin files have 5 float32 columns, the KITTI-style .bin files 4."""
    data = Path(data) if data is not None else DEFAULT_DATA
    if name_or_path in FRAMES:
        rel, cols = FRAMES[name_or_path]
        path, name = data / rel, name_or_path
    else:
        path = Path(name_or_path)
        if not path.is_absolute() and not path.exists():
            path = data / path
        cols, name = _columns_for(path), path.name
    if not path.exists():
        raise FileNotFoundError(f"frame {name_or_path!r} not found at {path} (use --data DIR)")
    raw = np.fromfile(path, dtype=np.float32)
    if raw.size % cols:
        raise ValueError(f"{path}: {raw.size} floats is not a multiple of {cols} columns")
    return Frame(name, raw.reshape(-1, cols))


def voxelize(points: np.ndarray, voxel: float) -> torch.Tensor:
    """int32 [M, 4] (batch 0, x, y, z) of the distinct voxels floor(xyz / voxel), in ascending
    (x, y, z) order (np.unique); non-finite points are dropped."""
    xyz = points[:, :3]
    xyz = xyz[np.isfinite(xyz).all(axis=1)]
    vox = np.unique(np.floor(xyz / voxel).astype(np.int32), axis=0)
    coords = np.zeros((len(vox), 4), dtype=np.int32)
    coords[:, 1:] = vox
    return torch.from_numpy(coords)


def subsample(points: np.ndarray, keep: float, seed: int = 0) -> np.ndarray:
    """A random `keep` share of the points (fixed seed), to make smaller maps from real frames."""
    if keep >= 1.0:
        return points
    rng = np.random.default_rng(seed)
    return points[rng.random(len(points)) < keep]


# ---------------------------------------------------------------- timing


def sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_fn(fn, device="cpu", warmup: int = 2, runs: int = 7, budget_s: float | None = None):
    """Median wall time (seconds) of fn() over `runs` calls after `warmup` calls, synchronizing
    the GPU around each call. With budget_s, stops early (at least 3 runs) once the measured
    calls used up that many seconds. Returns (median, list of times)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    spent = 0.0
    for i in range(runs):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        dt = time.perf_counter() - t0
        times.append(dt)
        spent += dt
        if budget_s is not None and i >= 2 and spent > budget_s:
            break
    return statistics.median(times), times


# ---------------------------------------------------------------- threads

_SPCONV_OMP: list = []


def _spconv_omp_runtimes() -> list:
    if not _SPCONV_OMP:
        try:
            import spconv
        except ImportError:
            _SPCONV_OMP.append(None)
            return []
        libs = Path(spconv.__file__).resolve().parent.parent / "spconv.libs"
        for path in sorted(glob.glob(str(libs / "libgomp*.so*"))):
            lib = ctypes.CDLL(path)  # already loaded by spconv: the same handle
            lib.omp_set_num_threads.argtypes = [ctypes.c_int]
            _SPCONV_OMP.append(lib)
        if not _SPCONV_OMP:
            _SPCONV_OMP.append(None)
    return [lib for lib in _SPCONV_OMP if lib is not None]


def set_threads(n: int) -> None:
    """n threads for torch, our kernels (same OpenMP runtime as torch) and spconv's own OpenMP."""
    torch.set_num_threads(n)
    for lib in _spconv_omp_runtimes():
        lib.omp_set_num_threads(n)


# ---------------------------------------------------------------- spconv


def spconv_available(device: str) -> tuple[bool, str]:
    try:
        import spconv  # noqa: F401
        import spconv.pytorch  # noqa: F401
    except Exception as exc:  # missing wheel, or a wheel built for another CUDA
        return False, f"spconv not importable: {exc}"
    if device == "cuda":
        from spconv.cppconstants import CPU_ONLY_BUILD

        if CPU_ONLY_BUILD:
            return False, "this spconv wheel is a CPU-only build (install spconv-cu126)"
    return True, ""


def spconv_coords(coords: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """spconv needs non-negative coordinates: shift each axis by a multiple of 8 (so strided
    maps are unchanged) and give the spatial shape that covers the shifted cloud."""
    xyz = coords[:, 1:].long()
    shift = torch.div(xyz.min(dim=0).values, 8, rounding_mode="floor") * 8
    shifted = coords.clone()
    shifted[:, 1:] = (xyz - shift).to(torch.int32)
    extent = xyz.max(dim=0).values - shift + 1
    spatial = [int((e + 7) // 8 * 8) for e in extent.tolist()]
    return shifted.contiguous(), spatial


def spconv_tensor(feats: torch.Tensor, sp_coords: torch.Tensor, spatial: list[int]):
    import spconv.pytorch as spconv

    return spconv.SparseConvTensor(feats, sp_coords, spatial, batch_size=1)


def env_summary(device: str) -> dict:
    info = {"torch": torch.__version__, "device": device, "cpu_count": os.cpu_count()}
    try:
        import spconv

        info["spconv"] = spconv.__version__
    except Exception:
        info["spconv"] = None
    if device == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    return info


def free_port() -> int:
    """A loopback port free at the time of asking."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_config(text: str) -> tuple[str, dict[str, str]]:
    """A benchmark's server configuration, 'NAME=VAR=VALUE,VAR2=VALUE2' -> (name, environment);
    'NAME=' is the server as shipped."""
    name, _, rest = text.partition("=")
    return name, dict(kv.split("=", 1) for kv in rest.split(",") if kv)


def start_server(
    weights: str, cr: float, device: str, env: dict | None = None, stderr=None, stdout=None
) -> tuple[subprocess.Popen, str]:
    """`python -m app serve` on a free loopback port with these weights; (process, base URL)
    once /readyz answers 200."""
    import httpx

    port = free_port()
    env = {
        **os.environ,
        "LIDARSEG_WEIGHTS": weights,
        "LIDARSEG_CR": str(cr),
        "LIDARSEG_LOG_LEVEL": "warning",
        **(env or {}),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", str(port), "--device", device],
        cwd=REPO_ROOT,
        env=env,
        stderr=stderr,
        stdout=stdout,
    )
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 300
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("server not ready in 300 s")
