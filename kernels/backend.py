"""Thin ctypes binding of the kernel libraries (csrc/api.h): pointers in, status code out.

The libraries are built on first use (kernels/build.py) and loaded once per process; `library()`
memoises the handle. torch is imported first so the CPU library shares PyTorch's OpenMP runtime.
"""
from __future__ import annotations

import ctypes
import functools
import re

import torch

STATUS_MESSAGES = {
    1: "coordinate out of range",
    2: "duplicate coordinate",
    3: "hash probe limit exceeded",
    4: "bad argument",
    5: "CUDA error",
}


class KernelError(RuntimeError):
    """A kernel returned a non-zero status."""


def _declared_names(suffix: str) -> list[str]:
    from . import build  # imported lazily so `python -m kernels.build` runs without a warning

    text = (build.CSRC / "api.h").read_text()
    return re.findall(rf"LS_API int (ls_\w+_{suffix})\(", text)


@functools.lru_cache(maxsize=None)
def library(device_type: str) -> ctypes.CDLL:
    """The loaded kernel library for 'cpu' or 'cuda' (built on first use)."""
    from . import build

    if device_type == "cpu":
        path = build.build_cpu()
    elif device_type == "cuda":
        path = build.build_cuda()
    else:
        raise ValueError(f"no kernels for device type {device_type!r}")
    lib = ctypes.CDLL(str(path))
    for name in _declared_names(device_type):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def ptr(t: torch.Tensor | None) -> ctypes.c_void_p:
    """Raw data pointer of a contiguous tensor (None -> NULL)."""
    if t is None:
        return ctypes.c_void_p(0)
    if not t.is_contiguous():
        raise ValueError("kernel arguments must be contiguous")
    return ctypes.c_void_p(t.data_ptr())


def i64(v: int) -> ctypes.c_int64:
    return ctypes.c_int64(int(v))


def i32(v: int) -> ctypes.c_int32:
    return ctypes.c_int32(int(v))


def call(op: str, device: torch.device, *args) -> None:
    """Calls ls_<op>_<device type>(*args), appending the current stream on CUDA."""
    lib = library(device.type)
    if device.type == "cuda":
        args = (*args, ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream))
    status = getattr(lib, f"ls_{op}_{device.type}")(*args)
    if status != 0:
        raise KernelError(f"ls_{op}_{device.type}: {STATUS_MESSAGES.get(status, status)}")


DTYPE_SUFFIX = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16"}
