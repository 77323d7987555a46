"""Tensors derived from a weight (its bf16 copy, its int8 packing), made once per weight tensor and
kept beside it until it changes in place or goes away (kernels/bf16.py, kernels/int8.py)."""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

import torch

_lock = threading.RLock()  # re-entrant: a weakref callback may run inside a locked section
_cache: dict[tuple[int, str], tuple] = {}  # (id(weight), kind) -> (weakref, version, ptr, value)


def derived(weight: torch.Tensor, kind: str, make: Callable[[torch.Tensor], Any]) -> Any:
    """make(weight), cached per (weight tensor, kind) while the tensor's version and storage stay
    the same."""
    key = (id(weight), kind)
    with _lock:
        hit = _cache.get(key)
        if (
            hit is not None
            and hit[0]() is weight
            and hit[1:3] == (weight._version, weight.data_ptr())
        ):
            return hit[3]
    value = make(weight)
    with _lock:
        _cache[key] = (
            weakref.ref(weight, lambda _r, key=key: _forget(key)),  # type: ignore[misc]
            weight._version,
            weight.data_ptr(),
            value,
        )
    return value


def _forget(key: tuple[int, str]) -> None:
    with _lock:
        _cache.pop(key, None)
