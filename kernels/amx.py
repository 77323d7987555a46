"""AMX tiles (csrc/amx_tiles.h, amx_cpu.cpp): whether the fused int8 and bf16 kernels run on them
here (the CPU has them and Linux grants them), turning them off and on for every thread (tiles_off:
benchmarks and tests compare the kernels side by side), how many convs ran on them, and whether a
conv's shape fits them. The kernel library answers each question at run time; precision.py reports
the answers for /v1/model.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools

TILE_KINDS = {1: "int8", 2: "bf16"}  # the bits of ls_amx_tiles_cpu's answer (csrc/amx_cpu.cpp)


_TILES: list[tuple[str, ...]] = []  # amx_tiles' last answer: only amx_tiles changes it


def amx_tiles(request: int = -1) -> tuple[str, ...]:
    """The precisions whose fused kernels run on AMX tiles here (the CPU has them and Linux
    grants them): ("int8", "bf16") on an AMX CPU. request=0 turns tiles off and 1 back on (the
    default), for every thread: benchmarks and tests compare the kernels side by side. The
    answer is kept between requests (each bf16 conv asks; a library call cost about 10 us)."""
    if request == -1 and _TILES:
        return _TILES[0]
    kinds = _tiles_call(request)[0]
    _TILES[:] = [kinds]
    return kinds


def amx_tile_convs() -> int:
    """How many convs ran on AMX tiles in this process so far (tests: tiles did run)."""
    return _tiles_call(-1)[1]


def _tiles_call(request: int) -> tuple[tuple[str, ...], int]:
    from . import backend

    kinds, convs = ctypes.c_int32(0), ctypes.c_int64(0)
    lib = backend.library("cpu")
    if lib.ls_amx_tiles_cpu(request, ctypes.addressof(kinds), ctypes.addressof(convs)) != 0:
        raise ValueError(f"amx_tiles: request must be -1, 0 or 1, got {request}")
    return tuple(name for bit, name in TILE_KINDS.items() if kinds.value & bit), convs.value


@functools.lru_cache(maxsize=None)
def tiles_fit(row_bytes: int, cout: int) -> bool:
    """Whether a conv with input rows of row_bytes bytes and cout outputs fits AMX tiles (the
    staging copies' sizes, csrc/amx_tiles.h); larger ones stay on the AVX-512 kernels."""
    from . import backend

    return backend.library("cpu").ls_amx_shape_fits_cpu(row_bytes, cout) == 0


@contextlib.contextmanager
def tiles_off():
    """AMX tiles off inside the block (the AVX-512 kernels run), back to their state after."""
    was_on = bool(amx_tiles())
    amx_tiles(0)
    try:
        yield
    finally:
        amx_tiles(1 if was_on else 0)
