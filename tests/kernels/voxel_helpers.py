"""What the test_voxel*.py files share: the fields of packed voxel keys (kernels/voxel.py packs
batch << 51 | x << 34 | y << 17 | z; MASK keeps one axis)."""

from __future__ import annotations

import numpy as np

MASK = (1 << 17) - 1


def blocks_of(keys: np.ndarray, shift: int) -> np.ndarray:
    """int64 [n, 4]: (batch, x >> shift, y >> shift, z >> shift) of packed keys."""
    return np.stack(
        [keys >> 51] + [(keys >> (34 - 17 * a) & MASK) >> shift for a in range(3)], axis=1
    )
