"""Which arithmetic precision the CPU engine runs, chosen at run time from the CPU's features.

    auto  (default) int8 where the CPU has AVX512_VNNI (its dot products do twice the
          multiply-adds of AVX512_BF16's per instruction: on the AMD EPYC Zen 4 box, 470
          against 235 G per second and core, and our int8 network stage runs 1.3-1.4x faster
          than bf16; on the Intel Xeon with AMX both run on AMX tiles and int8 is still the
          faster) or AVX_VNNI (the same dot products 256 bits wide: Intel Core 12th gen on,
          Xeon 6 E-cores) or AVX2 alone (vpmaddwd: 1.06x fp32 on an AMD EPYC Zen 1), else
          bf16 where it has AVX512_BF16 or AMX_BF16 (every such CPU has AVX512_VNNI too),
          else fp32
    fp32  everything in fp32
    bf16  inputs and weights of every sparse conv rounded to bf16, products summed in fp32
          (the fused kernel, csrc/fused_bf16_cpu.cpp, on AMX tiles where the CPU has them, or
          torch's bf16 matmul on the grouped path); outputs, biases, residuals and the head
          stay fp32. Refused on a CPU without AVX512_BF16 or AMX_BF16: torch's emulated bf16
          matmul ran the default model's network 27x slower than fp32 there, on one core
          (AMD EPYC Zen 1, AVX2 only: 14 s against 0.51 s a KITTI frame).
    int8  input rows of every sparse conv as uint8 with one scale per row (measured as the row is
          quantized: nothing to calibrate), weights as int8 with one scale per offset and output
          channel, products summed exactly in int32 (csrc/int8_kernels.h: AVX512_VNNI dot
          products or AMX tiles, 256-bit AVX_VNNI, or AVX2's vpmaddwd, the same bits on every
          one); outputs, biases, residuals and the head stay fp32. Convs it does not apply to
          (the input layer, negative inputs) run in the fallback precision: bf16 where the CPU
          has it natively, else fp32. Refused on a CPU without AVX2.

On CUDA the precision is the model's dtype (fp16 models run fp16); this setting is CPU-only and
`resolve` answers fp32 for other devices. Whether the fused kernels run on AMX tiles is amx.py's.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from pathlib import Path

import torch

from .amx import amx_tiles

PRECISIONS = ("auto", "fp32", "bf16", "int8")
RUNNABLE = ("fp32", "bf16", "int8")
# /proc/cpuinfo flag -> the name reported (and printed in the README's precision table)
FEATURE_FLAGS = {
    "amx_bf16": "AMX_BF16",
    "amx_tile": "AMX_TILE",
    "avx512_bf16": "AVX512_BF16",
    "avx512_vnni": "AVX512_VNNI",
    "avx_vnni": "AVX_VNNI",
    "avx512f": "AVX512F",
    "avx2": "AVX2",
}


class PrecisionError(ValueError):
    """An unknown or refused precision name."""


@functools.lru_cache(maxsize=1)
def cpu_features() -> tuple[str, ...]:
    """The reduced-precision-relevant features of this CPU (FEATURE_FLAGS names), from
    /proc/cpuinfo, else from torch's own CPU probe."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    if not flags:
        probe = {
            "amx_tile": torch.cpu._is_amx_tile_supported,
            "avx512_bf16": torch.cpu._is_avx512_bf16_supported,
            "avx512_vnni": torch.cpu._is_vnni_supported,
            "avx512f": torch.cpu._is_avx512_supported,
            "avx2": torch.cpu._is_avx2_supported,
        }
        flags = {flag for flag, fn in probe.items() if _safe(fn)}
    return tuple(name for flag, name in FEATURE_FLAGS.items() if flag in flags)


def _safe(fn) -> bool:
    try:
        return bool(fn())
    except Exception:  # an older torch without the probe
        return False


@functools.lru_cache(maxsize=1)
def fused_bf16_lanes() -> int:
    """16 where the fused bf16 kernel runs on this CPU (AVX512_BF16, found at run time by the
    library itself), else 0."""
    from . import backend

    return int(backend.library("cpu").ls_fused_bf16_lanes_cpu())


# ls_fused_int8_kind_cpu's answers, by number (csrc/int8_kernels.h): the int8 kernels, narrowest
# first; every one gives the same bits
INT8_KERNELS = ("none", "avx2", "avx_vnni", "avx512_vnni")
INT8_DESCRIPTIONS = {  # for /v1/model and the benchmarks
    "none": "none (no AVX2)",
    "avx2": "fused AVX2 (vpmaddwd)",
    "avx_vnni": "fused AVX_VNNI (256-bit)",
    "avx512_vnni": "fused AVX512_VNNI",
}
# int8_kernel's last answer (kernel, its lanes: ls_fused_int8_lanes_cpu): only it changes this
_INT8: list = []


def int8_kernel(request: str | None = None) -> str:
    """The int8 kernel that runs (INT8_KERNELS): the widest this CPU has (found at run time by
    the library itself), unless `request` named another it runs, for every thread from then on
    ("best": the widest again); benchmarks and tests compare them. ValueError for a kernel this
    CPU cannot run."""
    if request is None and _INT8:
        return _INT8[0]
    from . import backend

    codes: dict[str | None, int] = {None: -1, "best": -2}
    codes.update((name, i) for i, name in enumerate(INT8_KERNELS))
    code = codes.get(request)
    if code is None:
        raise ValueError(f"unknown int8 kernel {request!r}: one of best, {', '.join(INT8_KERNELS)}")
    kind = ctypes.c_int32(0)
    lib = backend.library("cpu")
    if lib.ls_fused_int8_kind_cpu(code, ctypes.addressof(kind)) != 0:
        raise ValueError(f"this CPU cannot run the {request} int8 kernel")
    _INT8[:] = [INT8_KERNELS[kind.value], int(lib.ls_fused_int8_lanes_cpu())]
    return _INT8[0]


@contextlib.contextmanager
def int8_kernel_set(name: str):
    """int8_kernel(name) inside the block, the kernel that ran before after it."""
    before = int8_kernel()
    int8_kernel(name)
    try:
        yield
    finally:
        int8_kernel(before)


def fused_int8_lanes() -> int:
    """Output channels per vector of the int8 kernel that runs here (16 with AVX512_VNNI, 8 on
    256-bit AVX_VNNI or AVX2), 0 where none does."""
    int8_kernel()  # asks the library once
    return _INT8[1]


def tiles_running(precision: str) -> list[str]:
    """Of `precision` and its fallback (what runs the convs it does not apply to), the ones
    whose fused kernels run on AMX tiles here: ["int8", "bf16"] for int8 on an AMX CPU, [] for
    fp32 or without AMX (for /v1/model)."""
    return [p for p in amx_tiles() if p in (precision, fallback(precision))]


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (our fused kernel or torch's AMX matmul)."""
    return fused_bf16_lanes() > 0 or "AMX_BF16" in cpu_features()


def validate(name: str | None) -> str:
    """The canonical name of a requested precision; PrecisionError for unknown names."""
    value = (name or "auto").strip().lower()
    if value not in PRECISIONS:
        raise PrecisionError(f"unknown precision {name!r}: one of {', '.join(PRECISIONS)}")
    return value


# int8 runs where the CPU has one of these (FEATURE_FLAGS names): every int8 kernel needs AVX2
# at least (csrc/int8_kernels.h); AVX512_VNNI and AVX_VNNI CPUs all have it
INT8_FEATURES = ("AVX2",)
BF16_FEATURES = ("AVX512_BF16", "AMX_BF16")  # either multiplies bf16 natively


def offered(name: str | None) -> str:
    """validate(name), and for int8 and bf16 whether this CPU has what they need, by its
    /proc/cpuinfo flags (no kernel library loaded: the settings check at start-up)."""
    value = validate(name)
    features = set(cpu_features())
    if value == "int8" and not set(INT8_FEATURES) & features:
        raise PrecisionError(_no_int8())
    if value == "bf16" and not set(BF16_FEATURES) & features:
        raise PrecisionError(_no_bf16())
    return value


def _no_int8() -> str:
    return (
        "int8 needs AVX2 at least (AVX512_VNNI or AVX_VNNI for its full speed), which this "
        f"CPU lacks (it has: {', '.join(cpu_features()) or 'none of them'}); use auto or fp32"
    )


def _no_bf16() -> str:
    return (
        "bf16 needs AVX512_BF16 or AMX_BF16, which this CPU lacks (it has: "
        f"{', '.join(cpu_features()) or 'none of them'}; emulated, bf16 runs many times slower "
        "than fp32); use auto or fp32"
    )


def resolve(name: str | None, device: str | torch.device = "cpu") -> str:
    """What runs for a requested precision on a device: fp32, bf16 or int8 (PrecisionError for
    int8 on a CPU without an int8 kernel, bf16 on one without native bf16)."""
    value = validate(name)
    if torch.device(device).type != "cpu":
        return "fp32"
    if value == "auto":
        # int8 on every int8 kernel: even plain AVX2 (vpmaddwd) ran the int8 network 1.05-1.08x
        # faster than fp32 on the AMD EPYC Zen 1 box (2026-12-04, bench.precision, all four
        # frames), where one vector multiplier allows it no more multiply-adds a cycle than
        # fp32's two FMA pipes: the gain is uint8 rows, a quarter of fp32's bytes to gather
        return "int8" if fused_int8_lanes() else "bf16" if native_bf16() else "fp32"
    if value == "int8" and not fused_int8_lanes():
        raise PrecisionError(_no_int8())
    if value == "bf16" and not native_bf16():
        raise PrecisionError(_no_bf16())
    return value


def fallback(precision: str) -> str:
    """What a conv runs in where `precision` does not apply to it: int8's is bf16 where the CPU
    multiplies bf16 natively, else fp32; the others are their own."""
    if precision == "int8":
        return "bf16" if native_bf16() else "fp32"
    return precision


def describe(requested: str | None, running: str) -> dict:
    """For /v1/model and the CLI: what was asked, what runs, and why."""
    return {
        "requested": validate(requested),
        "running": running,
        "cpu_features": list(cpu_features()),
        "bf16_kernel": (
            "fused AMX_BF16 tiles"
            if "bf16" in amx_tiles()
            else "fused AVX512_BF16"
            if fused_bf16_lanes() > 0
            else "torch bf16 matmul (AMX)"
            if "AMX_BF16" in cpu_features()
            else "none (no AVX512_BF16 or AMX_BF16)"
        ),
        "int8_kernel": INT8_DESCRIPTIONS[int8_kernel()]
        if int8_kernel() != "avx512_vnni" or "int8" not in amx_tiles()
        else "fused AMX_INT8 tiles (AVX512_VNNI for narrow inputs)",
    }
