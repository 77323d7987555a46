"""Builds the kernel libraries: g++ for the CPU twin, nvcc for the CUDA twin.

Neither build includes PyTorch's C++ headers: the kernels export plain C functions (csrc/api.h)
that kernels/backend.py binds with ctypes. That keeps the CPU build to a few seconds with g++ alone
and lets nvcc compile the CUDA sources on its own (a Jetson Orin builds them in about a minute).

Libraries land in a cache folder keyed by a hash of the sources and flags, so an edited source is
rebuilt and a concurrent build never half-overwrites a library another process has loaded.

    python -m kernels.build            # build what this machine can (CPU; CUDA where nvcc exists)
    python -m kernels.build --cuda-arch 87 90 --cuda-only   # compile-check the CUDA twin
"""
from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
CPU_SOURCES = sorted(CSRC.glob("*_cpu.cpp"))
CUDA_SOURCES = sorted((CSRC / "cuda").glob("*.cu"))
HEADERS = sorted(CSRC.glob("*.h")) + sorted((CSRC / "cuda").glob("*.h"))
CXX_FLAGS = ["-O3", "-std=c++17", "-fPIC", "-shared", "-fopenmp", "-Wall", "-Wextra"]
# The library is compiled on the machine that runs it (first use, or deploy/setup.sh), so it may
# use that CPU's vector units; LIDARSEG_CPU_ARCH overrides (e.g. "armv8.2-a" or "x86-64-v3").
CPU_ARCH = os.environ.get("LIDARSEG_CPU_ARCH", "native")
DEFAULT_CUDA_ARCHS = ("87", "90")  # Jetson Orin, H100 / H200


class BuildError(RuntimeError):
    """A compiler failed; the message holds its command line and output."""


def cache_dir() -> Path:
    root = os.environ.get("LIDARSEG_BUILD_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lidarseg"


def _digest(sources: list[Path], flags: list[str]) -> str:
    h = hashlib.sha256(" ".join(flags).encode())
    for path in sorted(sources + HEADERS):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")


def _build(name: str, sources: list[Path], cmd_for, flags: list[str]) -> Path:
    target = cache_dir() / f"{name}-{_digest(sources, flags)}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        _run(cmd_for(partial))
        os.replace(partial, target)  # atomic: readers see the old library or the new one
    return target


def build_cpu() -> Path:
    """Compiles liblidarseg_cpu.so (g++ and OpenMP) and returns its path."""
    cxx = os.environ.get("CXX", "g++")
    flags = [*CXX_FLAGS, f"-march={CPU_ARCH}" if CPU_ARCH != "native" else "-march=native"]
    if platform.machine() == "aarch64" and CPU_ARCH == "native":
        flags[-1] = "-mcpu=native"  # gcc on ARM spells it -mcpu
    return _build(
        "liblidarseg_cpu",
        CPU_SOURCES,
        lambda out: [cxx, *flags, f"-I{CSRC}", *map(str, CPU_SOURCES), "-o", str(out)],
        flags,
    )


def nvcc_path() -> str | None:
    return shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
    )


def cuda_flags(archs: tuple[str, ...]) -> list[str]:
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    return ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-lineinfo", *gencode]


def build_cuda(archs: tuple[str, ...] | None = None) -> Path:
    """Compiles liblidarseg_cuda.so with nvcc for `archs` (default: this GPU, else 87 and 90)."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise BuildError("nvcc not found: install the CUDA toolkit to build the CUDA kernels")
    archs = archs or _local_archs() or DEFAULT_CUDA_ARCHS
    flags = cuda_flags(tuple(archs))
    return _build(
        "liblidarseg_cuda",
        CUDA_SOURCES,
        lambda out: [nvcc, *flags, f"-I{CSRC}", *map(str, CUDA_SOURCES), "-o", str(out)],
        flags,
    )


def compile_cuda_object(source: Path, arch: str, out_dir: Path) -> Path:
    """nvcc -c one .cu for one architecture (CI's compile check, no GPU needed)."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise BuildError("nvcc not found")
    out = out_dir / f"{source.stem}_sm{arch}.o"
    _run([nvcc, "-c", "-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-Werror", "all-warnings",
          f"-gencode=arch=compute_{arch},code=sm_{arch}", f"-I{CSRC}", str(source), "-o", str(out)])
    return out


def _local_archs() -> tuple[str, ...] | None:
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return (f"{major}{minor}",)
    except Exception:  # torch missing or no driver: fall back to the defaults
        return None
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--cuda-arch", nargs="*", default=None, help="e.g. 87 90")
    parser.add_argument("--cuda-only", action="store_true", help="only compile-check the .cu files")
    args = parser.parse_args(argv)
    if args.cuda_only:
        with tempfile.TemporaryDirectory() as tmp:
            for source in CUDA_SOURCES:
                for arch in args.cuda_arch or DEFAULT_CUDA_ARCHS:
                    print(compile_cuda_object(source, arch, Path(tmp)).name)
        return 0
    print(build_cpu())
    if nvcc_path() is not None and _local_archs() is not None:
        print(build_cuda(tuple(args.cuda_arch) if args.cuda_arch else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
