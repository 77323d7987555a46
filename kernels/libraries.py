"""Which kernel library this process loads (kernels/backend.py binds it): one from the cache
(LIDARSEG_BUILD_DIR) whose manifest fits this machine (kernels/targets.py), else one built now
(kernels/build.py). With LIDARSEG_KERNEL_BUILD=never (the images) nothing is compiled at run
time: `library_path` loads a prebuilt library that fits this machine or raises
targets.LibraryMissing saying what is missing.
"""

from __future__ import annotations

import platform
from pathlib import Path

from . import targets, toolchain
from .build import CPU_SOURCES, CUDA_SOURCES, build_cpu, build_cuda, sources_digest


def library_path(device_type: str) -> Path:
    """The library to load for 'cpu' or 'cuda' on this machine. A cached CUDA library whose arch
    list covers this GPU is used as it is; otherwise the library is built, unless
    LIDARSEG_KERNEL_BUILD=never, where only a fitting prebuilt one will do."""
    if device_type == "cpu":
        if not toolchain.prebuilt_only():
            return build_cpu()
        machine = platform.machine()
        libs = targets.cached(toolchain.cache_dir(), "cpu", sources_digest(CPU_SOURCES))
        found = targets.best_cpu(libs, machine, targets.host_cpu_flags())
        what = f"this {machine} CPU"
    elif device_type == "cuda":
        cap = toolchain.device_capability() or (0, 0)
        libs = targets.cached(toolchain.cache_dir(), "cuda", sources_digest(CUDA_SOURCES))
        found = targets.best_cuda(libs, platform.machine(), cap)
        if found is None and not toolchain.prebuilt_only():
            return build_cuda()
        what = f"this GPU (sm_{cap[0]}{cap[1]})"
    else:
        raise ValueError(f"no kernels for device type {device_type!r}")
    if found is None:
        have = "; ".join(b.describe() for b in libs) or "none"
        raise targets.LibraryMissing(
            f"no prebuilt {device_type.upper()} kernel library in {toolchain.cache_dir()} "
            f"fits {what} (found: {have}). LIDARSEG_KERNEL_BUILD=never forbids compiling at run "
            "time: rebuild the image with LIDARSEG_CPU_ISA / LIDARSEG_CUDA_ARCHS covering this "
            "machine."
        )
    return found.path
