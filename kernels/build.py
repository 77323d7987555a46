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
LIDARSEG_KERNEL_BUILD=never (the images) nothing is compiled at run time: `library_path` loads a
prebuilt library that fits this machine or raises targets.LibraryMissing saying what is missing.

    python -m kernels.build                          # what this machine needs (CPU; CUDA on a GPU)
    python -m kernels.build --isa x86-64-v3 x86-64-v4 --cuda-arch 75 80 86 87 89 90   # images
    python -m kernels.build --cuda-arch 87 90 --cuda-only   # compile-check the CUDA twin
    python -m kernels.build --list                   # the cached libraries and their targets
    python kernels/build.py --isa none --cuda-arch 87  # as a file: stdlib only, no torch needed
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__:
    from . import targets
else:  # run as a file (`python kernels/build.py`): no torch needed, e.g. in a CUDA build stage
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import targets  # type: ignore[no-redef]

CSRC = Path(__file__).resolve().parent / "csrc"
CPU_SOURCES = sorted(CSRC.glob("*_cpu.cpp"))
CUDA_SOURCES = sorted((CSRC / "cuda").glob("*.cu"))
HEADERS = sorted(CSRC.glob("*.h")) + sorted((CSRC / "cuda").glob("*.h"))
CXX_FLAGS = ["-O3", "-std=c++17", "-fPIC", "-shared", "-fopenmp", "-Wall", "-Wextra"]
DEFAULT_CUDA_ARCHS = ("87", "90")  # Jetson Orin, H100 / H200


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


def _hash(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def sources_digest(sources: list[Path]) -> str:
    """Hash of the sources and headers alone (what a prebuilt library must match)."""
    return _hash(*(p.name.encode() + p.read_bytes() for p in sorted(sources + HEADERS)))


def _run(cmd: list[str]) -> str:
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


def compile_shared(cxx: str, flags: list[str], sources: list[Path], out: Path) -> None:
    """g++ -shared: one compiler per source (the largest first, build_jobs() at a time), the
    objects beside `out`, then one link. The same code as one g++ call over every source."""
    objects = {s: out.with_name(f"{out.stem}.{s.stem}.o") for s in sources}
    compile_flags = [f for f in flags if f != "-shared"]

    def compile_one(source: Path) -> str:
        target = ["-c", str(source), "-o", str(objects[source])]
        return _run([cxx, *compile_flags, f"-I{CSRC}", *target])

    largest_first = sorted(sources, key=lambda s: s.stat().st_size, reverse=True)
    with ThreadPoolExecutor(max_workers=build_jobs()) as pool:
        list(pool.map(compile_one, largest_first))  # raises the first BuildError
    _run([cxx, *flags, *map(str, objects.values()), "-o", str(out)])


def _build(name: str, key: str, build_into: Callable[[Path], object], manifest: dict) -> Path:
    target = cache_dir() / f"{name}-{key}.so"
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


@functools.lru_cache(maxsize=None)
def compiler_identity(cxx: str) -> tuple[str, str]:
    """(target triple, version) of a gcc-compatible compiler: ('x86_64-linux-gnu', '12.2.0')."""
    return _run([cxx, "-dumpmachine"]).strip(), _run([cxx, "-dumpfullversion"]).strip()


def isa_flags(isa: str, machine: str) -> list[str]:
    if isa == "native":
        return ["-mcpu=native"] if machine == "aarch64" else ["-march=native"]
    return [f"-march={isa}", "-mtune=generic"]


@functools.lru_cache(maxsize=None)
def predefined_macros(cxx: str, flags: tuple[str, ...]) -> tuple[str, ...]:
    """What the target resolves to: the compiler's predefined macros under these flags."""
    return tuple(sorted(_run([cxx, *flags, "-dM", "-E", "-x", "c++", "/dev/null"]).splitlines()))


def build_cpu(isa: str | None = None, cxx: str | None = None) -> Path:
    """Compiles liblidarseg_cpu.so (g++ and OpenMP) for `isa` and returns its path."""
    isa = isa or cpu_isa()
    cxx = cxx or os.environ.get("CXX", "g++")
    triple, version = compiler_identity(cxx)
    machine = triple.split("-")[0]
    target = isa_flags(isa, machine)
    flags = [*CXX_FLAGS, *target, *os.environ.get("LIDARSEG_CXXFLAGS", "").split()]
    macros = predefined_macros(cxx, tuple(target))
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


def nvcc_path() -> str | None:
    return shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
    )


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    """e.g. 'V12.6.77' (the last word of `nvcc --version`)."""
    return _run([nvcc, "--version"]).split()[-1]


def cuda_flags(archs: tuple[str, ...]) -> list[str]:
    """Machine code for every arch, plus PTX for the highest (JIT on newer GPUs)."""
    archs = tuple(sorted(set(archs), key=int))
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    ptx = f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}"
    return ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-lineinfo", *gencode, ptx]


def build_cuda(archs: tuple[str, ...] | None = None) -> Path:
    """Compiles liblidarseg_cuda.so with nvcc for `archs` (default: LIDARSEG_CUDA_ARCHS, else
    this GPU, else 87 and 90). No GPU is needed."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise BuildError("nvcc not found: install the CUDA toolkit to build the CUDA kernels")
    archs = tuple(
        sorted(set(archs or cuda_archs_from_env() or _local_archs() or DEFAULT_CUDA_ARCHS), key=int)
    )
    flags = cuda_flags(archs)
    sources = sources_digest(CUDA_SOURCES)
    machine = platform.machine()  # nvcc builds the host code for the machine it runs on
    manifest = {
        "kind": "cuda",
        "machine": machine,
        "sources": sources,
        "archs": list(archs),
        "ptx": archs[-1],
        "compiler": f"nvcc {nvcc_version(nvcc)}",
        "flags": flags,
    }
    key = _hash(sources, " ".join(flags), nvcc_version(nvcc), machine)
    return _build(
        "liblidarseg_cuda",
        key,
        lambda out: _run(
            [nvcc, *flags, f"--threads={build_jobs()}", f"-I{CSRC}", *map(str, CUDA_SOURCES)]
            + ["-o", str(out)]  # --threads: the archs compiled at once; not a flag of the key
        ),
        manifest,
    )


def compile_cuda_object(source: Path, arch: str, out_dir: Path) -> Path:
    """nvcc -c one .cu for one architecture (CI's compile check, no GPU needed)."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise BuildError("nvcc not found")
    out = out_dir / f"{source.stem}_sm{arch}.o"
    _run(
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


def _device_capability() -> tuple[int, int] | None:
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return major, minor
    except Exception:  # torch missing or no driver
        return None
    return None


def _local_archs() -> tuple[str, ...] | None:
    cap = _device_capability()
    return (f"{cap[0]}{cap[1]}",) if cap else None


def library_path(device_type: str) -> Path:
    """The library to load for 'cpu' or 'cuda' on this machine. A cached CUDA library whose arch
    list covers this GPU is used as it is; otherwise the library is built, unless
    LIDARSEG_KERNEL_BUILD=never, where only a fitting prebuilt one will do."""
    if device_type == "cpu":
        if not prebuilt_only():
            return build_cpu()
        machine = platform.machine()
        libs = targets.cached(cache_dir(), "cpu", sources_digest(CPU_SOURCES))
        found = targets.best_cpu(libs, machine, targets.host_cpu_flags())
        what = f"this {machine} CPU"
    elif device_type == "cuda":
        cap = _device_capability() or (0, 0)
        libs = targets.cached(cache_dir(), "cuda", sources_digest(CUDA_SOURCES))
        found = targets.best_cuda(libs, platform.machine(), cap)
        if found is None and not prebuilt_only():
            return build_cuda()
        what = f"this GPU (sm_{cap[0]}{cap[1]})"
    else:
        raise ValueError(f"no kernels for device type {device_type!r}")
    if found is None:
        have = "; ".join(b.describe() for b in libs) or "none"
        raise targets.LibraryMissing(
            f"no prebuilt {device_type.upper()} kernel library in {cache_dir()} fits {what} "
            f"(found: {have}). LIDARSEG_KERNEL_BUILD=never forbids compiling at run time: rebuild "
            "the image with LIDARSEG_CPU_ISA / LIDARSEG_CUDA_ARCHS covering this machine."
        )
    return found.path


def _list() -> None:
    for kind, sources in (("cpu", CPU_SOURCES), ("cuda", CUDA_SOURCES)):
        current = sources_digest(sources)
        for manifest in sorted(cache_dir().glob(f"liblidarseg_{kind}-*.json")):
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
    archs = tuple(args.cuda_arch or ()) or cuda_archs_from_env()
    if args.cuda_only:
        with tempfile.TemporaryDirectory() as tmp:
            for source in CUDA_SOURCES:
                for arch in archs or DEFAULT_CUDA_ARCHS:
                    print(compile_cuda_object(source, arch, Path(tmp)).name)
        return 0
    for isa in args.isa or [cpu_isa()]:
        if isa != "none":
            print(build_cpu(isa))
    if archs is not None or (nvcc_path() is not None and _local_archs() is not None):
        print(build_cuda(archs))  # asked for explicitly: a missing nvcc is an error
    return 0


if __name__ == "__main__":
    sys.exit(main())
