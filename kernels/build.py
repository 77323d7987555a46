"""Builds the kernel libraries: g++ for the CPU twin, nvcc for the CUDA twin.

Neither build includes PyTorch's C++ headers: the kernels export plain C functions (csrc/api.h)
that kernels/backend.py binds with ctypes. That keeps the CPU build to seconds with g++ alone
and lets nvcc compile the CUDA sources on its own (a Jetson Orin builds them in about a minute).

Targets are explicit. The CPU library is compiled for a named ISA level (LIDARSEG_CPU_ISA, e.g.
`x86-64-v3`, `x86-64-v4`, `armv8.2-a`; `native`, the default, only for a library used on the
machine that built it). The CUDA library holds machine code for every arch in LIDARSEG_CUDA_ARCHS
(e.g. "75 80 86 87 89 90") and PTX for the highest; no GPU is needed to build it. CXX and
LIDARSEG_CXXFLAGS (e.g. "-Werror") choose the compiler (a cross compiler too) and extra flags.
The sources compile in parallel (LIDARSEG_BUILD_JOBS, default one compiler per CPU): the CPU
library 31 -> 19 s and the CUDA one (two archs and PTX) 14 -> 9 s on 2 Zen 1 cores.

Libraries land in a cache folder (LIDARSEG_BUILD_DIR) under a key that hashes the sources, the
flags, the compiler's identity and what the target resolves to (its predefined macros), each with
a manifest that kernels/targets.py matches against the CPU or GPU at load time. Writes are atomic,
so a concurrent build never half-overwrites a library another process has loaded. With
LIDARSEG_KERNEL_BUILD=never (the images) nothing is compiled at run time: `library_path`
(kernels/libraries.py) loads a prebuilt library that fits this machine or raises
targets.LibraryMissing saying what is missing. The compilers, their target flags and the
LIDARSEG_* settings are kernels/toolchain.py's.

    python -m kernels.build                          # what this machine needs (CPU; CUDA on a GPU)
    python -m kernels.build --isa x86-64-v3 x86-64-v4 --cuda-arch 75 80 86 87 89 90   # images
    python -m kernels.build --cuda-arch 87 90 --cuda-only   # compile-check the CUDA twin
    python -m kernels.build --list                   # the cached libraries and their targets
    python kernels/build.py --isa none --cuda-arch 87  # as a file: stdlib only, no torch needed
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__:
    from . import targets, toolchain
else:  # run as a file (`python kernels/build.py`): no torch needed, e.g. in a CUDA build stage
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import targets  # type: ignore[no-redef]
    import toolchain  # type: ignore[no-redef]

CSRC = Path(__file__).resolve().parent / "csrc"
CPU_SOURCES = sorted(CSRC.glob("*_cpu.cpp"))
CUDA_SOURCES = sorted((CSRC / "cuda").glob("*.cu"))
HEADERS = sorted(CSRC.glob("*.h")) + sorted((CSRC / "cuda").glob("*.h"))
CXX_FLAGS = ["-O3", "-std=c++17", "-fPIC", "-shared", "-fopenmp", "-Wall", "-Wextra"]
DEFAULT_CUDA_ARCHS = ("87", "90")  # Jetson Orin, H100 / H200


def _hash(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def sources_digest(sources: list[Path]) -> str:
    """Hash of the sources and headers alone (what a prebuilt library must match)."""
    return _hash(*(p.name.encode() + p.read_bytes() for p in sorted(sources + HEADERS)))


def compile_shared(cxx: str, flags: list[str], sources: list[Path], out: Path) -> None:
    """g++ -shared: one compiler per source (the largest first, build_jobs() at a time), the
    objects beside `out`, then one link. The same code as one g++ call over every source."""
    objects = {s: out.with_name(f"{out.stem}.{s.stem}.o") for s in sources}
    compile_flags = [f for f in flags if f != "-shared"]

    def compile_one(source: Path) -> str:
        target = ["-c", str(source), "-o", str(objects[source])]
        return toolchain.run([cxx, *compile_flags, f"-I{CSRC}", *target])

    largest_first = sorted(sources, key=lambda s: s.stat().st_size, reverse=True)
    with ThreadPoolExecutor(max_workers=toolchain.build_jobs()) as pool:
        list(pool.map(compile_one, largest_first))  # raises the first BuildError
    toolchain.run([cxx, *flags, *map(str, objects.values()), "-o", str(out)])


def _build(name: str, key: str, build_into: Callable[[Path], object], manifest: dict) -> Path:
    target = toolchain.cache_dir() / f"{name}-{key}.so"
    if target.exists() and target.with_suffix(".json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        build_into(partial)
        os.replace(partial, target)  # atomic: readers see the old library or the new one
        note = Path(tmp) / "manifest.json"
        note.write_text(json.dumps(manifest, indent=1) + "\n")
        os.replace(note, target.with_suffix(".json"))
    return target


def build_cpu(isa: str | None = None, cxx: str | None = None) -> Path:
    """Compiles liblidarseg_cpu.so (g++ and OpenMP) for `isa` and returns its path."""
    isa = isa or toolchain.cpu_isa()
    cxx = cxx or os.environ.get("CXX", "g++")
    triple, version = toolchain.compiler_identity(cxx)
    machine = triple.split("-")[0]
    target = toolchain.isa_flags(isa, machine)
    flags = [*CXX_FLAGS, *target, *os.environ.get("LIDARSEG_CXXFLAGS", "").split()]
    macros = toolchain.predefined_macros(cxx, tuple(target))
    sources = sources_digest(CPU_SOURCES)
    manifest = {
        "kind": "cpu",
        "sources": sources,
        "isa": isa,
        "machine": machine,
        "requires": targets.required_cpu_flags(list(macros), machine),
        "compiler": f"{Path(cxx).name} {version} {triple}",
        "flags": flags,
    }
    key = _hash(sources, " ".join(flags), triple, version, *macros)
    return _build(
        "liblidarseg_cpu",
        key,
        lambda out: compile_shared(cxx, flags, CPU_SOURCES, out),
        manifest,
    )


def build_cuda(archs: tuple[str, ...] | None = None) -> Path:
    """Compiles liblidarseg_cuda.so with nvcc for `archs` (default: LIDARSEG_CUDA_ARCHS, else
    this GPU, else 87 and 90). No GPU is needed."""
    nvcc = toolchain.nvcc_path()
    if nvcc is None:
        raise toolchain.BuildError(
            "nvcc not found: install the CUDA toolkit to build the CUDA kernels"
        )
    archs = tuple(
        sorted(
            set(
                archs
                or toolchain.cuda_archs_from_env()
                or toolchain.local_archs()
                or DEFAULT_CUDA_ARCHS
            ),
            key=int,
        )
    )
    flags = toolchain.cuda_flags(archs)
    sources = sources_digest(CUDA_SOURCES)
    machine = platform.machine()  # nvcc builds the host code for the machine it runs on
    manifest = {
        "kind": "cuda",
        "machine": machine,
        "sources": sources,
        "archs": list(archs),
        "ptx": archs[-1],
        "compiler": f"nvcc {toolchain.nvcc_version(nvcc)}",
        "flags": flags,
    }
    key = _hash(sources, " ".join(flags), toolchain.nvcc_version(nvcc), machine)
    return _build(
        "liblidarseg_cuda",
        key,
        lambda out: toolchain.run(
            [
                nvcc,
                *flags,
                f"--threads={toolchain.build_jobs()}",
                f"-I{CSRC}",
                *map(str, CUDA_SOURCES),
            ]
            + ["-o", str(out)]  # --threads: the archs compiled at once; not a flag of the key
        ),
        manifest,
    )


def compile_cuda_object(source: Path, arch: str, out_dir: Path) -> Path:
    """nvcc -c one .cu for one architecture (CI's compile check, no GPU needed)."""
    nvcc = toolchain.nvcc_path()
    if nvcc is None:
        raise toolchain.BuildError("nvcc not found")
    out = out_dir / f"{source.stem}_sm{arch}.o"
    toolchain.run(
        [
            nvcc,
            "-c",
            "-O3",
            "-std=c++17",
            "-Xcompiler",
            "-fPIC",
            "-Werror",
            "all-warnings",
            f"-gencode=arch=compute_{arch},code=sm_{arch}",
            f"-I{CSRC}",
            str(source),
            "-o",
            str(out),
        ]
    )
    return out


def _list() -> None:
    for kind, sources in (("cpu", CPU_SOURCES), ("cuda", CUDA_SOURCES)):
        current = sources_digest(sources)
        for manifest in sorted(toolchain.cache_dir().glob(f"liblidarseg_{kind}-*.json")):
            m = json.loads(manifest.read_text())
            stale = "" if m.get("sources") == current else "  (stale: older sources)"
            target = m.get("isa") or "sm_" + ",".join(m.get("archs", [])) + f" +PTX {m.get('ptx')}"
            print(f"{manifest.with_suffix('.so')}  {target}  {m.get('compiler')}{stale}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--isa",
        nargs="+",
        default=None,
        help="CPU ISA levels, e.g. x86-64-v3 x86-64-v4 (default: LIDARSEG_CPU_ISA "
        "or native); none: no CPU library",
    )
    parser.add_argument(
        "--cuda-arch",
        nargs="*",
        default=None,
        help="e.g. 75 80 86 87 89 90 (default: LIDARSEG_CUDA_ARCHS); given, the "
        "CUDA library is built even without a GPU",
    )
    parser.add_argument("--cuda-only", action="store_true", help="only compile-check the .cu files")
    parser.add_argument("--list", action="store_true", help="list the cached libraries")
    args = parser.parse_args(argv)
    if args.list:
        _list()
        return 0
    archs = tuple(args.cuda_arch or ()) or toolchain.cuda_archs_from_env()
    if args.cuda_only:
        with tempfile.TemporaryDirectory() as tmp:
            for source in CUDA_SOURCES:
                for arch in archs or DEFAULT_CUDA_ARCHS:
                    print(compile_cuda_object(source, arch, Path(tmp)).name)
        return 0
    for isa in args.isa or [toolchain.cpu_isa()]:
        if isa != "none":
            print(build_cpu(isa))
    if archs is not None or (
        toolchain.nvcc_path() is not None and toolchain.local_archs() is not None
    ):
        print(build_cuda(archs))  # asked for explicitly: a missing nvcc is an error
    return 0


if __name__ == "__main__":
    sys.exit(main())
