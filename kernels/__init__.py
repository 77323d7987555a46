"""lidarseg kernels: coordinate hashing, kernel maps, the grouped gather-matmul-scatter engine."""

from .hashtable import (
    CoordHashTable,
    CoordinateError,
    CoordinateRangeError,
    DuplicateCoordinateError,
    HashProbeError,
)
from .downsampling import downsample
from .kmap import KernelMap, kernel_offsets, submanifold_map

__all__ = [
    "CoordHashTable",
    "CoordinateError",
    "CoordinateRangeError",
    "DuplicateCoordinateError",
    "HashProbeError",
    "KernelMap",
    "downsample",
    "kernel_offsets",
    "submanifold_map",
]
