"""Portable kernel builds: named ISA levels, keys that see the resolved target, prebuilt look-up.

The ISA checks disassemble the built libraries (objdump): an x86-64-v3 library must hold no
AVX-512 (zmm) instruction whatever the build host has, except in the run-time dispatched bf16 and
int8 kernels (fused_bf16_cpu.cpp, fused_int8_cpu.cpp, reached only after the CPU feature check);
the v4 one must. The CUDA
build runs without a GPU and its fat binary is read back for the machine code it holds.
"""

from __future__ import annotations

import json
import platform
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from kernels import build, libraries, targets, toolchain

x86_only = pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 ISA levels")
needs_objdump = pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump not found")
needs_nvcc = pytest.mark.skipif(toolchain.nvcc_path() is None, reason="nvcc not found")


# The sources allowed AVX-512 in a portable library: their functions carry target attributes
# and run only after a run-time CPU feature check (kernels/precision.py; the head's argmax in
# engine_cpu.cpp and the AMX tiles, amx_cpu.cpp, check on their own).
RUNTIME_DISPATCHED = tuple(
    Path(build.__file__).parent / "csrc" / name
    for name in (
        "fused_bf16_cpu.cpp",
        "fused_int8_cpu.cpp",
        "int8_after_block.h",
        "quantize_u8.h",
        "engine_cpu.cpp",
        "amx_tiles.h",
    )
)


def _zmm_by_function(lib: Path) -> dict[str, int]:
    """AVX-512 (zmm) instruction count per function (demangled base name) in a library."""
    text = subprocess.run(
        ["objdump", "-d", "-C", "--no-show-raw-insn", str(lib)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts: dict[str, int] = {}
    function = ""
    for line in text.splitlines():
        if line.endswith(">:") and "<" in line:
            symbol = line[line.index("<") + 1 : -2].replace("(anonymous namespace)::", "")
            match = re.search(r"(\w+)(?:<[^()]*>)?\(", symbol)
            function = match.group(1) if match else symbol
        elif "%zmm" in line:
            counts[function] = counts.get(function, 0) + 1
    return counts


def _zmm_outside_dispatch(lib: Path) -> dict[str, int]:
    dispatched = "".join(path.read_text() for path in RUNTIME_DISPATCHED)
    return {f: n for f, n in _zmm_by_function(lib).items() if f" {f}(" not in dispatched}


@x86_only
@needs_objdump
def test_named_isa_levels_are_what_they_say(tmp_path, monkeypatch):
    monkeypatch.setenv("LIDARSEG_BUILD_DIR", str(tmp_path))
    v3, v4 = build.build_cpu("x86-64-v3"), build.build_cpu("x86-64-v4")
    assert v3 != v4
    assert _zmm_outside_dispatch(v3) == {}
    assert sum(_zmm_outside_dispatch(v4).values()) > 0
    m3, m4 = (json.loads(p.with_suffix(".json").read_text()) for p in (v3, v4))
    assert {"avx2", "fma"} <= set(m3["requires"]) and "avx512f" not in m3["requires"]
    assert set(m3["requires"]) < set(m4["requires"]) and "avx512f" in m4["requires"]
    assert not any("native" in f for f in m3["flags"] + m4["flags"])
    assert m3["sources"] == m4["sources"] == build.sources_digest(build.CPU_SOURCES)
    assert build.build_cpu("x86-64-v3") == v3  # cached: same key, no rebuild


def test_key_sees_resolved_target_and_compiler(monkeypatch):
    """The same -march=native on another CPU, or another compiler version, is another library."""
    monkeypatch.setattr(build, "_build", lambda name, key, cmd, manifest: key)
    keys = set()
    for version, macro in (("12.2.0", "AVX2"), ("12.2.0", "AVX512F"), ("13.1.0", "AVX2")):
        monkeypatch.setattr(
            toolchain, "compiler_identity", lambda cxx, v=version: ("x86_64-linux-gnu", v)
        )
        monkeypatch.setattr(
            toolchain, "predefined_macros", lambda cxx, flags, m=macro: (f"#define __{m}__ 1",)
        )
        keys.add(build.build_cpu("native"))
    assert len(keys) == 3


def test_host_flags_and_best_cpu_library(tmp_path):
    x86 = "processor\t: 0\nflags\t\t: fpu sse avx avx2 fma\n"
    arm = "processor\t: 0\nFeatures\t: fp asimd atomics asimdrdm crc32\n"
    assert targets.host_cpu_flags(x86) == {"fpu", "sse", "avx", "avx2", "fma"}
    assert "atomics" in targets.host_cpu_flags(arm)

    def lib(name, requires, machine="x86_64"):
        return targets.Built(
            tmp_path / name, {"kind": "cpu", "isa": name, "machine": machine, "requires": requires}
        )

    v3, v4 = lib("v3", ["avx2", "fma"]), lib("v4", ["avx2", "avx512f", "fma"])
    arm_lib = lib("a82", ["asimd", "atomics"], "aarch64")
    libs = [v3, v4, arm_lib]
    assert targets.best_cpu(libs, "x86_64", {"avx2", "fma"}) is v3
    assert targets.best_cpu(libs, "x86_64", {"avx2", "fma", "avx512f"}) is v4
    assert targets.best_cpu(libs, "x86_64", {"avx"}) is None
    assert targets.best_cpu(libs, "aarch64", targets.host_cpu_flags(arm)) is arm_lib


def test_arm_requirements_from_macros():
    macros = ["#define __ARM_NEON 1", "#define __ARM_FEATURE_ATOMICS 1", "#define __aarch64__ 1"]
    assert targets.required_cpu_flags(macros, "aarch64") == ["asimd", "atomics"]


@pytest.mark.parametrize(
    "archs,ptx,cap,expected",
    [
        (["75", "80", "86", "87", "89", "90"], "90", (8, 7), True),
        (["86"], None, (8, 7), True),  # sm_86 machine code runs on 8.7
        (["87"], None, (8, 6), False),  # but not the other way round
        (["87"], None, (9, 0), False),  # another major version needs PTX
        (["87"], "87", (9, 0), True),  # PTX JIT-compiles for newer GPUs
        (["87", "90"], "90", (12, 0), True),
        (["80", "90"], "90", (7, 5), False),  # PTX never runs on older GPUs
    ],
)
def test_cuda_arch_list_covers(archs, ptx, cap, expected):
    assert targets.covers(archs, ptx, cap) is expected


def test_prebuilt_only_fails_clearly_and_finds_a_fitting_library(tmp_path, monkeypatch):
    monkeypatch.setenv("LIDARSEG_BUILD_DIR", str(tmp_path))
    monkeypatch.setenv("LIDARSEG_KERNEL_BUILD", "never")
    monkeypatch.setattr(toolchain, "device_capability", lambda: (8, 7))
    with pytest.raises(targets.LibraryMissing, match=r"no prebuilt CUDA .*sm_87.*found: none"):
        libraries.library_path("cuda")
    sources = build.sources_digest(build.CUDA_SOURCES)
    here, other = platform.machine(), "aarch64" if platform.machine() != "aarch64" else "x86_64"
    for name, archs, ptx, digest, machine in (
        ("0", ["87"], "87", sources, other),  # an Orin's library in a shared cache, say
        ("a", ["90"], "90", sources, here),
        ("b", ["87"], "87", "stale", here),
        ("c", ["75", "86"], "86", sources, here),
    ):
        (tmp_path / f"liblidarseg_cuda-{name}.so").write_bytes(b"")
        manifest = {"kind": "cuda", "archs": archs, "ptx": ptx, "sources": digest}
        (tmp_path / f"liblidarseg_cuda-{name}.json").write_text(
            json.dumps({**manifest, "machine": machine})
        )
    # 0 is for another machine, b is stale, a is sm_90
    assert libraries.library_path("cuda").name == "liblidarseg_cuda-c.so"
    monkeypatch.setattr(toolchain, "device_capability", lambda: (7, 0))
    with pytest.raises(targets.LibraryMissing, match=r"sm_70.*liblidarseg_cuda-a\.so \(sm_90"):
        libraries.library_path("cuda")
    with pytest.raises(targets.LibraryMissing, match="no prebuilt CPU"):
        libraries.library_path("cpu")


def _fatbin_cubin_archs(lib: Path) -> set[int]:
    """The sm versions of the CUDA ELF images (EM_CUDA = 190) embedded in a library."""
    data, archs, i = lib.read_bytes(), set(), 0
    while (i := data.find(b"\x7fELF", i + 1)) != -1:
        if struct.unpack_from("<H", data, i + 18)[0] == 190:
            archs.add((struct.unpack_from("<I", data, i + 48)[0] >> 8) & 0xFF)
    return archs


@needs_nvcc
def test_cuda_build_without_gpu_holds_every_arch_and_ptx(tmp_path, monkeypatch):
    monkeypatch.setenv("LIDARSEG_BUILD_DIR", str(tmp_path))
    monkeypatch.setenv("LIDARSEG_CUDA_ARCHS", "90 75")
    monkeypatch.setattr(toolchain, "device_capability", lambda: None)  # as in an image build
    lib = build.build_cuda()
    manifest = json.loads(lib.with_suffix(".json").read_text())
    assert manifest["archs"] == ["75", "90"] and manifest["ptx"] == "90"
    assert _fatbin_cubin_archs(lib) == {75, 90}
    assert b".target sm_90" in lib.read_bytes()  # PTX for the highest arch
    monkeypatch.setenv("LIDARSEG_KERNEL_BUILD", "never")
    monkeypatch.setattr(toolchain, "device_capability", lambda: (10, 0))  # a newer GPU: PTX
    assert libraries.library_path("cuda") == lib


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
def test_parallel_build_links_every_source_and_names_a_failing_one(tmp_path, monkeypatch):
    """compile_shared: one compiler per source, then one link; a broken source fails the build
    with its compiler's message, whichever of the parallel compilers hits it."""
    import ctypes

    sources = []
    for i in range(5):
        sources.append(tmp_path / f"part{i}.cpp")
        sources[-1].write_text(f'extern "C" int part{i}() {{ return {i * 7}; }}\n')
    monkeypatch.setenv("LIDARSEG_BUILD_JOBS", "3")
    lib = tmp_path / "libparts.so"
    build.compile_shared("g++", ["-O2", "-fPIC", "-shared"], sources, lib)
    loaded = ctypes.CDLL(str(lib))
    assert [getattr(loaded, f"part{i}")() for i in range(5)] == [0, 7, 14, 21, 28]

    sources[3].write_text("int broken( {\n")
    with pytest.raises(toolchain.BuildError, match="part3.cpp"):
        build.compile_shared("g++", ["-O2", "-fPIC", "-shared"], sources, tmp_path / "libx.so")
    monkeypatch.setenv("LIDARSEG_BUILD_JOBS", "two")
    with pytest.raises(toolchain.BuildError, match="LIDARSEG_BUILD_JOBS"):
        toolchain.build_jobs()
