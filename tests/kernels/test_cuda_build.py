"""Compile checks for the CUDA twin (kernels/csrc/cuda/*.cu); needs nvcc, not a GPU.

These tests skip when nvcc is missing. CI cannot pass by skipping them silently: .ci/run checks
separately that nvcc is present before it runs the test suite.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kernels import build, toolchain

ARCHS = ("87", "90")
CUDA_SOURCES = sorted((build.CSRC / "cuda").glob("*.cu"))

needs_nvcc = pytest.mark.skipif(toolchain.nvcc_path() is None, reason="nvcc not found")


def _declared_cuda_entry_points() -> set[str]:
    text = (build.CSRC / "api_cuda.h").read_text()
    return set(re.findall(r"LS_API\s+int\s+(ls_\w+_cuda)\b", text))


def test_cuda_sources_exist():
    assert CUDA_SOURCES, "no .cu files under kernels/csrc/cuda"
    assert _declared_cuda_entry_points(), "api_cuda.h declares no ls_*_cuda functions"


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", CUDA_SOURCES, ids=lambda p: p.name)
def test_compile_cuda_object(source: Path, arch: str, tmp_path: Path):
    # compile_cuda_object uses -Werror all-warnings, so any nvcc warning fails here.
    obj = build.compile_cuda_object(source, arch, tmp_path)
    assert obj.exists() and obj.stat().st_size > 0


@needs_nvcc
def test_shared_library_exports_every_cuda_entry_point(tmp_path: Path, monkeypatch):
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) not found")
    monkeypatch.setenv("LIDARSEG_BUILD_DIR", str(tmp_path))
    lib = build.build_cuda(ARCHS)
    assert lib.exists() and lib.parent == tmp_path
    proc = subprocess.run(
        ["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True
    )
    # nm prints "address type name"; the name is the last column.
    exported = {line.split()[-1] for line in proc.stdout.splitlines() if line.strip()}
    missing = sorted(_declared_cuda_entry_points() - exported)
    assert not missing, f"not exported by {lib.name}: {missing}"
