"""Checked ctypes binding of the kernel libraries (csrc/api.h, api_cuda.h): tensors in, status
code out.

Every function's argument types come from its declaration in those headers, so a call with the wrong
number of arguments raises TypeError, and every tensor is checked against the C type, the op's
device and contiguity before its pointer reaches C (a CPU pointer in a CUDA kernel would kill the
process's CUDA context): kernels/arguments.py reads the declarations and checks the arguments. CUDA
ops run under their tensors' device (torch.cuda.device) on its current stream; with
LIDARSEG_CUDA_SYNC=1 every CUDA call is followed by a synchronisation, so a fault inside a kernel
raises here, with the CUDA error text and the op's name.

The libraries are built on first use or found prebuilt (kernels/libraries.py `library_path`) and
loaded once per process; `library()` memoises the handle. torch is imported first so the CPU
library shares PyTorch's OpenMP runtime.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import os
from typing import Any

import torch

from . import deferred
from .arguments import (
    API_CUDA_H,
    API_H,
    SCALAR_TYPES,
    Spec,
    _arity_error,
    _c_args,
    _spec,
    signatures,
)


class Status(enum.IntEnum):
    """The status codes of csrc/common.h (tests/kernels/test_bindings.py checks them)."""

    OK = 0
    OUT_OF_RANGE = 1
    DUPLICATE = 2
    PROBE_LIMIT = 3
    BAD_ARGUMENT = 4
    CUDA_ERROR = 5


STATUS_MESSAGES = {
    Status.OUT_OF_RANGE: "coordinate out of range",
    Status.DUPLICATE: "duplicate coordinate",
    Status.PROBE_LIMIT: "hash probe limit exceeded",
    Status.BAD_ARGUMENT: "bad argument",
    Status.CUDA_ERROR: "CUDA error",
}


class KernelError(RuntimeError):
    """A kernel returned a non-zero status (for CUDA errors, with the CUDA error text)."""


CPU = torch.device("cpu")


@functools.lru_cache(maxsize=None)
def library(device_type: str) -> ctypes.CDLL:
    """The loaded kernel library for 'cpu' or 'cuda' (built on first use or found prebuilt),
    every function declared with its argument types."""
    from . import libraries  # lazily: `python -m kernels.build` then runs without a warning

    if device_type == "cuda" and not torch.cuda.is_available():
        raise KernelError("a CUDA kernel was asked for, but torch sees no CUDA device")
    return bind(libraries.library_path(device_type), device_type)


def bind(path, device_type: str) -> ctypes.CDLL:
    """Loads a kernel library and declares the argument and result types of every function
    api.h or api_cuda.h declares for `device_type`."""
    lib = ctypes.CDLL(str(path))
    for name, params in signatures().items():
        if name.endswith("_" + device_type):
            fn = getattr(lib, name)
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p if p.pointer else SCALAR_TYPES[p.ctype] for p in params]
    return lib


def _device_of(device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def sync_after_each_launch() -> bool:
    """LIDARSEG_CUDA_SYNC=1: synchronise after every CUDA call and raise on a kernel fault."""
    return os.environ.get("LIDARSEG_CUDA_SYNC", "0") not in ("", "0")


def last_cuda_error() -> str:
    """Text of the last CUDA error the CUDA library saw on this thread ('' if none)."""
    buf = ctypes.create_string_buffer(512)
    library("cuda").ls_last_error_cuda(buf, len(buf))
    return buf.value.decode(errors="replace")


@functools.lru_cache(maxsize=None)
def _cpu_op(op: str) -> tuple[str, Any, Spec]:
    """(name, function, per parameter: (Param, the dtype a pointer takes, the range an int
    takes)) of ls_<op>_cpu, found once: call()'s per-call work is then the checks alone."""
    name = f"ls_{op}_cpu"
    params = signatures().get(name)
    if params is None:
        raise KernelError(f"{name} is not declared in {API_H.name}")
    return name, getattr(library("cpu"), name), _spec(params)


def _call_cpu(op: str, args: tuple) -> None:
    """call() on the CPU: a contiguous CPU tensor of the declared dtype, None for a pointer
    (NULL) and an int in range go straight through (about 3 us a call instead of 7 to 20: a
    frame makes about 110 calls on the thread that runs the network); anything else takes
    _convert's checks and messages. Inside kernels/deferred.py's calls_deferred(), a
    deferrable op, checked and converted, waits to run with the others."""
    name, fn, spec = _cpu_op(op)
    if len(args) != len(spec):
        raise _arity_error(name, [s[0] for s in spec], len(args))
    c_args = _c_args(name, spec, args, CPU, None)
    waiting = deferred.pending()
    if waiting is not None:  # inside deferred.calls_deferred()
        if op in deferred.DEFERRABLE:
            waiting.append((name, fn, c_args, args, raise_for_cpu))  # args: tensors stay alive
            if len(waiting) >= deferred.MAX_PENDING:
                deferred.settle()
            return
        deferred.settle()  # any other kernel runs after the calls before it, as they were made
    _raise_for(name, fn(*c_args), CPU)


@functools.lru_cache(maxsize=None)
def _cuda_op(op: str) -> tuple[str, Any, Spec, bool]:
    """_cpu_op's record for ls_<op>_cuda, and whether it takes the stream as its last
    parameter (call() appends the current one)."""
    name = f"ls_{op}_cuda"
    params = signatures().get(name)
    if params is None:
        raise KernelError(f"{name} is not declared in {API_CUDA_H.name}")
    streamed = bool(params) and params[-1].name == "stream"
    spec = _spec(params[:-1] if streamed else params)
    return name, getattr(library("cuda"), name), spec, streamed


def _call_cuda(op: str, device: torch.device, args: tuple) -> None:
    """call() on CUDA, with _call_cpu's fast checks (a contiguous tensor of the declared dtype
    on the op's device goes straight through; anything else takes _convert's checks and
    messages), under the device only when it is not already the current one. The H200
    profile put this binding's per-call Python among the CUDA path's host costs (about 200
    calls a frame)."""
    name, fn, spec, streamed = _cuda_op(op)
    if len(args) != len(spec):
        raise _arity_error(name, [s[0] for s in spec], len(args))
    index = device.index
    c_args = _c_args(name, spec, args, device, index)
    if torch.cuda.current_device() == index:
        status = _launch_cuda(fn, c_args, streamed, index)
    else:
        with torch.cuda.device(index):
            status = _launch_cuda(fn, c_args, streamed, index)
    _raise_for(name, status, device)


def _launch_cuda(fn, c_args: list, streamed: bool, index: int) -> int:
    """Runs a converted CUDA call on the device's current stream (LIDARSEG_CUDA_SYNC: then
    synchronises, so a kernel fault is this call's status)."""
    stream = torch.cuda.current_stream(index).cuda_stream
    if streamed:
        c_args.append(stream)
    status = fn(*c_args)
    if status == 0 and sync_after_each_launch():
        status = library("cuda").ls_sync_cuda(ctypes.c_void_p(stream))
    return status


def raise_for_cpu(name: str, status: int) -> None:
    """KernelError unless status is OK (a deferred call's, when it has run)."""
    _raise_for(name, status, CPU)


def call(op: str, device, *args) -> None:
    """Calls ls_<op>_<device type>(*args): tensors (checked), None (NULL) and ints, in api.h's
    order; on CUDA under the device and with its current stream appended."""
    if device == "cpu" or getattr(device, "type", None) == "cpu":
        return _call_cpu(op, args)
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise KernelError(f"ls_{op}_cuda: a CUDA op was asked for, but torch sees no CUDA device")
    if device.type != "cuda":
        raise KernelError(f"ls_{op}_{device.type}: the kernels run on cpu and cuda only")
    return _call_cuda(op, _device_of(device), args)


def refuse(op: str, device: torch.device, why: str) -> None:
    """The KernelError a C twin's kStatusBadArgument gives, for an op's torch twin (CUDA paths
    written with torch ops keep the C twin's checks)."""
    raise KernelError(f"ls_{op}_{device.type}: {STATUS_MESSAGES[Status.BAD_ARGUMENT]} ({why})")


def _raise_for(name: str, status: int, device: torch.device) -> None:
    if status == Status.OK:
        return
    text = STATUS_MESSAGES.get(status, f"status {status}")  # type: ignore[call-overload]
    if status == Status.CUDA_ERROR and device.type == "cuda":
        text = f"{text}: {last_cuda_error()}"
    raise KernelError(f"{name}: {text}")


DTYPE_SUFFIX = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16"}
