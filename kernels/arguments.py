"""A kernel call's arguments: each function's parameters as csrc/api.h (and, for the CUDA twin's own
functions, csrc/api_cuda.h) declares them (`signatures`), and each argument checked against its C
type and converted for ctypes. A contiguous tensor of the declared dtype on the op's device becomes
its pointer, None a NULL and an int in the C type's range itself; anything else raises TypeError or
ValueError naming the op and the parameter before a pointer reaches C. kernels/backend.py binds the
functions and makes the calls.
"""

from __future__ import annotations

import ctypes
import functools
import operator
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

API_H = Path(__file__).resolve().parent / "csrc" / "api.h"
API_CUDA_H = API_H.with_name("api_cuda.h")  # the CUDA twin's declarations

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
        raise ValueError(f"api.h / api_cuda.h: cannot read parameter {text!r}")
    return Param(m.group(3), m.group(1) + m.group(2))


@functools.lru_cache(maxsize=None)
def signatures() -> dict[str, tuple[Param, ...]]:
    """Every function api.h and api_cuda.h declare: name -> parameters in order."""
    text = re.sub(r"//[^\n]*", "", API_H.read_text() + API_CUDA_H.read_text())
    found = {}
    for name, params in re.findall(r"LS_API\s+int\s+(ls_\w+)\s*\(([^)]*)\)\s*;", text):
        params = params.strip()
        found[name] = () if params in ("", "void") else tuple(map(_param, params.split(",")))
    return found


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
