"""What a built kernel library can run on, and which cached library to load on this machine.

Every library that kernels/build.py writes has a manifest beside it (`<library>.json`): the hash of
the sources it was compiled from, and either the CPU features its code assumes (read from the
compiler's predefined macros for the chosen ISA level, spelled as /proc/cpuinfo spells them) or
the CUDA architectures it holds machine code for plus the one it carries PTX for. The loader needs
no compiler to pick a library: it matches manifests against this CPU's flags or this GPU's compute
capability.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# Predefined macro of gcc/clang -> the /proc/cpuinfo flag of a CPU that has the feature.
X86_FEATURES = {
    "__SSE3__": "pni",
    "__SSSE3__": "ssse3",
    "__SSE4_1__": "sse4_1",
    "__SSE4_2__": "sse4_2",
    "__POPCNT__": "popcnt",
    "__LAHF_SAHF__": "lahf_lm",
    "__MOVBE__": "movbe",
    "__XSAVE__": "xsave",
    "__AVX__": "avx",
    "__AVX2__": "avx2",
    "__FMA__": "fma",
    "__F16C__": "f16c",
    "__BMI__": "bmi1",
    "__BMI2__": "bmi2",
    "__LZCNT__": "abm",
    "__AVX512F__": "avx512f",
    "__AVX512BW__": "avx512bw",
    "__AVX512CD__": "avx512cd",
    "__AVX512DQ__": "avx512dq",
    "__AVX512VL__": "avx512vl",
    "__AVX512VNNI__": "avx512_vnni",
    "__AVX512BF16__": "avx512_bf16",
    "__AVX512VBMI__": "avx512vbmi",
    "__AVX512IFMA__": "avx512ifma",
    "__AES__": "aes",
    "__PCLMUL__": "pclmulqdq",
    "__SHA__": "sha_ni",
    "__ADX__": "adx",
    "__RDSEED__": "rdseed",
    "__RDRND__": "rdrand",
    "__VAES__": "vaes",
    "__GFNI__": "gfni",
}
ARM_FEATURES = {
    "__ARM_NEON": "asimd",
    "__ARM_FEATURE_ATOMICS": "atomics",
    "__ARM_FEATURE_QRDMX": "asimdrdm",
    "__ARM_FEATURE_CRC32": "crc32",
    "__ARM_FEATURE_DOTPROD": "asimddp",
    "__ARM_FEATURE_FP16_VECTOR_ARITHMETIC": "asimdhp",
    "__ARM_FEATURE_FP16_SCALAR_ARITHMETIC": "fphp",
    "__ARM_FEATURE_AES": "aes",
    "__ARM_FEATURE_SHA2": "sha2",
    "__ARM_FEATURE_SVE": "sve",
    "__ARM_FEATURE_JCVT": "jscvt",
    "__ARM_FEATURE_COMPLEX": "fcma",
}


class LibraryMissing(RuntimeError):
    """No usable prebuilt library, and compiling at run time is switched off."""


def required_cpu_flags(macros: list[str], machine: str) -> list[str]:
    """The cpuinfo flags a library compiled with these predefined macros needs."""
    table = X86_FEATURES if machine == "x86_64" else ARM_FEATURES if machine == "aarch64" else {}
    defined = {line.split()[1] for line in macros if line.startswith("#define ")}
    return sorted({flag for macro, flag in table.items() if macro in defined})


def host_cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """This CPU's feature flags ("flags" on x86, "Features" on ARM) from /proc/cpuinfo."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def covers(archs: list[str], ptx: str | None, capability: tuple[int, int]) -> bool:
    """Whether a CUDA library runs on a device: machine code for the same major version and a
    minor version no higher than the device's, or PTX for a capability no higher (JIT)."""
    major, minor = capability
    for arch in archs:
        a_major, a_minor = divmod(int(arch), 10)
        if a_major == major and a_minor <= minor:
            return True
    return ptx is not None and divmod(int(ptx), 10) <= (major, minor)


@dataclass(frozen=True)
class Built:
    path: Path
    manifest: dict

    def describe(self) -> str:
        m = self.manifest
        if m["kind"] == "cpu":
            return f"{self.path.name} ({m['machine']}, {m['isa']})"
        ptx = f" + PTX compute_{m['ptx']}" if m.get("ptx") else ""
        return f"{self.path.name} (sm_{', sm_'.join(m['archs'])}{ptx})"


def cached(root: Path, kind: str, sources: str) -> list[Built]:
    """Every library of this kind in `root` built from exactly these sources."""
    found = []
    for manifest_path in sorted(root.glob(f"liblidarseg_{kind}-*.json")):
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError):
            continue
        lib = manifest_path.with_suffix(".so")
        if manifest.get("sources") == sources and lib.exists():
            found.append(Built(lib, manifest))
    return found


def best_cpu(libs: list[Built], machine: str, flags: set[str]) -> Built | None:
    """The usable CPU library that assumes the most features (x86-64-v4 over v3, say)."""
    usable = [
        b for b in libs if b.manifest["machine"] == machine and set(b.manifest["requires"]) <= flags
    ]
    return max(usable, key=lambda b: (len(b.manifest["requires"]), b.path.name), default=None)


def best_cuda(libs: list[Built], machine: str, capability: tuple[int, int]) -> Built | None:
    """A CUDA library built on this machine's architecture (a cache shared by an x86 server and
    an aarch64 Orin holds both) that covers the device, preferring machine code over PTX."""
    usable = [
        b
        for b in libs
        if b.manifest.get("machine") == machine
        and covers(b.manifest["archs"], b.manifest.get("ptx"), capability)
    ]
    native = [b for b in usable if covers(b.manifest["archs"], None, capability)]
    chosen = native or usable
    return chosen[0] if chosen else None
