"""Checked ctypes binding of the kernel libraries (csrc/api.h): tensors in, status code out.

Every function's argument types come from its declaration in csrc/api.h, so a call with the wrong
number of arguments raises TypeError, and every tensor is checked against the C type, the op's
device and contiguity before its pointer reaches C (a CPU pointer in a CUDA kernel would kill the
process's CUDA context). CUDA ops run under their tensors' device (torch.cuda.device) on its
current stream; with LIDARSEG_CUDA_SYNC=1 every CUDA call is followed by a synchronisation, so a
fault inside a kernel raises here, with the CUDA error text and the op's name.

The libraries are built on first use or found prebuilt (kernels/libraries.py `library_path`) and
loaded once per process; `library()` memoises the handle. torch is imported first so the CPU
library shares PyTorch's OpenMP runtime.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import operator
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import deferred

API_H = Path(__file__).resolve().parent / "csrc" / "api.h"


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


# C pointee type -> the dtype of the tensor that may be passed for it (uint16_t: fp16 bits;
# ls_bf16: bf16 bits; lidarseg::Slot: the hash table's int64 [capacity, 2] slots).
POINTEE_DTYPES = {
    "int32_t": torch.int32,
    "int64_t": torch.int64,
    "uint8_t": torch.uint8,
    "int8_t": torch.int8,
    "float": torch.float32,
    "double": torch.float64,
    "uint16_t": torch.float16,
    "lidarseg::Slot": torch.int64,
    "ls_bf16": torch.bfloat16,
}
SCALAR_TYPES = {"int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64}
CPU = torch.device("cpu")


@dataclass(frozen=True)
class Param:
    name: str
    ctype: str  # the C type without const, e.g. "int32_t*" or "int64_t"

    @property
    def pointer(self) -> bool:
        return self.ctype.endswith("*")


def _param(text: str) -> Param:
    m = re.fullmatch(r"(?:const\s+)?([\w:]+)\s*(\*?)\s*(\w+)", text.strip())
    if m is None:
        raise ValueError(f"api.h: cannot read parameter {text!r}")
    return Param(m.group(3), m.group(1) + m.group(2))


@functools.lru_cache(maxsize=None)
def signatures() -> dict[str, tuple[Param, ...]]:
    """Every function api.h declares: name -> parameters in order."""
    text = re.sub(r"//[^\n]*", "", API_H.read_text())
    found = {}
    for name, params in re.findall(r"LS_API\s+int\s+(ls_\w+)\s*\(([^)]*)\)\s*;", text):
        params = params.strip()
        found[name] = () if params in ("", "void") else tuple(map(_param, params.split(",")))
    return found


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
    api.h declares for `device_type`."""
    lib = ctypes.CDLL(str(path))
    for name, params in signatures().items():
        if name.endswith("_" + device_type):
            fn = getattr(lib, name)
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p if p.pointer else SCALAR_TYPES[p.ctype] for p in params]
    return lib


def _check_tensor(op: str, p: Param, t: torch.Tensor, device: torch.device) -> None:
    want = POINTEE_DTYPES.get(p.ctype[:-1])
    if want is None:
        raise TypeError(f"{op}: {p.name} ({p.ctype}) takes no tensor")
    if t.dtype != want:
        raise TypeError(f"{op}: {p.name} must be {want}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{op}: {p.name} is on {t.device}, the op runs on {device}")
    if not t.is_contiguous():
        raise ValueError(f"{op}: {p.name} must be contiguous")


def _convert(op: str, p: Param, value, device: torch.device):
    if isinstance(value, torch.Tensor):
        if not p.pointer:
            raise TypeError(f"{op}: {p.name} ({p.ctype}) takes a number, got a tensor")
        _check_tensor(op, p, value, device)
        return ctypes.c_void_p(value.data_ptr())
    if p.pointer:
        if value is None:
            return ctypes.c_void_p(0)
        if isinstance(value, (ctypes.Array, ctypes.c_void_p)):  # host buffers (error text)
            return value
        raise TypeError(f"{op}: {p.name} ({p.ctype}) takes a tensor, got {type(value).__name__}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{op}: {p.name} ({p.ctype}) takes an int, got {type(value).__name__}"
        ) from None
    lo, hi = _int_range(p.ctype)
    if not lo <= value < hi:
        raise ValueError(f"{op}: {p.name} = {value} does not fit {p.ctype}")
    return value


def _int_range(ctype: str) -> tuple[int, int]:
    """[lo, hi) of a C integer type of SCALAR_TYPES."""
    bits = ctypes.sizeof(SCALAR_TYPES[ctype]) * 8
    return -(1 << (bits - 1)), 1 << (bits - 1)


def _arity_error(name: str, params, got: int) -> TypeError:
    return TypeError(
        f"{name} takes {len(params)} arguments ({', '.join(p.name for p in params)}), got {got}"
    )


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


Spec = tuple[tuple[Param, Any, int, int], ...]


def _spec(params) -> Spec:
    """Per parameter: (Param, the dtype a pointer takes, the range an int takes)."""
    spec = []
    for p in params:
        want = POINTEE_DTYPES.get(p.ctype[:-1]) if p.pointer else None
        spec.append((p, want, *((0, 0) if p.pointer else _int_range(p.ctype))))
    return tuple(spec)


def _c_args(name: str, spec: Spec, args: tuple, device: torch.device, cuda: int | None) -> list:
    """The C arguments of one call on `device` (cuda: its index, None for the CPU; passed in,
    since reading torch.device.type costs 0.8 us): a contiguous tensor of the declared dtype
    on the device, None for a pointer (NULL) and an int in range go straight through;
    anything else takes _convert's checks and messages."""
    c_args: list[Any] = []
    for (p, want, lo, hi), a in zip(spec, args):
        if want is not None:
            if (
                isinstance(a, torch.Tensor)
                and a.dtype is want
                and (a.is_cpu if cuda is None else a.is_cuda and a.get_device() == cuda)
                and a.is_contiguous()
            ):
                c_args.append(a.data_ptr())
                continue
            if a is None:  # NULL
                c_args.append(None)
                continue
        elif type(a) is int and lo <= a < hi:
            c_args.append(a)
            continue
        c_args.append(_convert(name, p, a, device))
    return c_args


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
        raise KernelError(f"{name} is not declared in {API_H.name}")
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
