"""The kernel build's tools and settings: the compilers (g++ or CXX, nvcc), what they say about
themselves and the flags that name a target, this machine's GPU, and the LIDARSEG_* variables
that choose the targets, the parallelism and the library cache (kernels/build.py reads them all
here).

The standard library only, no torch at import (device_capability imports it when asked): build.py
imports this module as a plain file too (`python kernels/build.py`, in a CUDA build stage).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path


class BuildError(RuntimeError):
    """A compiler failed; the message holds its command line and output."""


def cache_dir() -> Path:
    root = os.environ.get("LIDARSEG_BUILD_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lidarseg"


def cpu_isa() -> str:
    """LIDARSEG_CPU_ISA (LIDARSEG_CPU_ARCH is the older name), default `native`."""
    return os.environ.get("LIDARSEG_CPU_ISA") or os.environ.get("LIDARSEG_CPU_ARCH") or "native"


def cuda_archs_from_env() -> tuple[str, ...] | None:
    """LIDARSEG_CUDA_ARCHS ("75 80 8.6;87,90") as sorted unique "XY" strings, or None."""
    text = os.environ.get("LIDARSEG_CUDA_ARCHS", "")
    archs = {a.replace(".", "") for a in re.split(r"[\s,;]+", text) if a}
    if any(not a.isdigit() for a in archs):
        raise BuildError(f"LIDARSEG_CUDA_ARCHS={text!r}: expected numbers like '75 87 90'")
    return tuple(sorted(archs, key=int)) or None


def prebuilt_only() -> bool:
    return os.environ.get("LIDARSEG_KERNEL_BUILD", "auto") == "never"


def run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def build_jobs() -> int:
    """How many compilers run at once: LIDARSEG_BUILD_JOBS, default one per CPU we may use."""
    text = os.environ.get("LIDARSEG_BUILD_JOBS", "")
    if text and not (text.isdigit() and int(text) > 0):
        raise BuildError(f"LIDARSEG_BUILD_JOBS={text!r}: expected a positive number")
    if text:
        return int(text)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@functools.lru_cache(maxsize=None)
def compiler_identity(cxx: str) -> tuple[str, str]:
    """(target triple, version) of a gcc-compatible compiler: ('x86_64-linux-gnu', '12.2.0')."""
    return run([cxx, "-dumpmachine"]).strip(), run([cxx, "-dumpfullversion"]).strip()


def isa_flags(isa: str, machine: str) -> list[str]:
    if isa == "native":
        return ["-mcpu=native"] if machine == "aarch64" else ["-march=native"]
    return [f"-march={isa}", "-mtune=generic"]


@functools.lru_cache(maxsize=None)
def predefined_macros(cxx: str, flags: tuple[str, ...]) -> tuple[str, ...]:
    """What the target resolves to: the compiler's predefined macros under these flags."""
    return tuple(sorted(run([cxx, *flags, "-dM", "-E", "-x", "c++", "/dev/null"]).splitlines()))


def nvcc_path() -> str | None:
    return shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
    )


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    """e.g. 'V12.6.77' (the last word of `nvcc --version`)."""
    return run([nvcc, "--version"]).split()[-1]


def cuda_flags(archs: tuple[str, ...]) -> list[str]:
    """Machine code for every arch, plus PTX for the highest (JIT on newer GPUs)."""
    archs = tuple(sorted(set(archs), key=int))
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    ptx = f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}"
    return ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-lineinfo", *gencode, ptx]


def device_capability() -> tuple[int, int] | None:
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return major, minor
    except Exception:  # torch missing or no driver
        return None
    return None


def local_archs() -> tuple[str, ...] | None:
    cap = device_capability()
    return (f"{cap[0]}{cap[1]}",) if cap else None
