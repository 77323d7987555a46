"""Coordinate hash table: open addressing over packed 64-bit keys, bounded linear probing.

Capacity and load factor: a table for n keys has capacity = the next power of two >= 2 n (at least
16), so the load factor is at most 0.5. Each slot is two int64 words (key, value); a table filled
with -1 is empty. An insert may probe at most MAX_PROBES slots; needing more is an error
(HashProbeError), never an endless loop, and a lookup stops there too. A miss is -1.

Keys pack (batch, x, y, z) as 10 + 18 + 18 + 18 bits (csrc/common.h): batch in [0, 1022], each
coordinate in [-131072, 131071] (about +-6.5 km at 5 cm voxels). Coordinates outside that range
raise CoordinateRangeError at insert time and are a plain miss at lookup time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import backend

# The key layout, limits and error word of csrc/common.h (tests/kernels/test_bindings.py checks
# every one against the header).
COORD_BITS = 18
BATCH_BITS = 10
BATCH_MAX = (1 << BATCH_BITS) - 2
COORD_MIN = -(1 << (COORD_BITS - 1))
COORD_MAX = (1 << (COORD_BITS - 1)) - 1
MAX_PROBES = 512
MAX_OFFSETS = 343  # per lookup: up to a 7x7x7 kernel
EMPTY = -1  # an empty slot's key word and a missing value (kEmptyKey, kMiss)
ERROR_ROW_BITS = 48  # err = (status << ERROR_ROW_BITS) | row, or NO_ERROR
NO_ERROR = -1
INT32_MAX = 2**31 - 1


def pack_key(coords: torch.Tensor) -> torch.Tensor:
    """int64 [N]: the packed keys of int32 [N, 4] coords in range, as the kernels store them."""
    c = coords.long()
    biased = [c[:, a] - COORD_MIN for a in (1, 2, 3)]
    return (
        (c[:, 0] << 3 * COORD_BITS)
        | (biased[0] << 2 * COORD_BITS)
        | (biased[1] << COORD_BITS)
        | biased[2]
    )


class CoordinateError(ValueError):
    """Invalid input coordinates (the message names the row and its value)."""


class CoordinateRangeError(CoordinateError):
    pass


class DuplicateCoordinateError(CoordinateError):
    pass


class HashProbeError(RuntimeError):
    pass


def capacity_for(num_keys: int) -> int:
    """Smallest power of two >= 2 * num_keys (load factor <= 0.5), at least 16."""
    cap = 16
    while cap < 2 * num_keys:
        cap *= 2
    return cap


def check_coords(coords: torch.Tensor) -> None:
    if coords.dtype != torch.int32 or coords.dim() != 2 or coords.shape[1] != 4:
        raise CoordinateError(
            "coords must be int32 [N, 4] (batch, x, y, z), "
            f"got {coords.dtype} {tuple(coords.shape)}"
        )


def new_error_buffer(device: torch.device) -> torch.Tensor:
    """The kernels' error word (csrc/common.h: report_error), set to NO_ERROR."""
    return torch.full((1,), NO_ERROR, dtype=torch.int64, device=device)


def _first_duplicate_rows(coords: torch.Tensor) -> list[int]:
    """The rows sharing the coordinate of the first row that has a twin (any device)."""
    _, inverse, counts = torch.unique(coords, dim=0, return_inverse=True, return_counts=True)
    twinned = (counts[inverse] > 1).nonzero().flatten()
    first = int(twinned[0])
    return (inverse == inverse[first]).nonzero().flatten().tolist()


def raise_duplicates(coords: torch.Tensor) -> None:
    """Raises DuplicateCoordinateError naming the first row that has a twin, and its twins."""
    same = _first_duplicate_rows(coords)
    raise DuplicateCoordinateError(
        f"duplicate coordinate {coords[same[0]].tolist()} (batch, x, y, z) at rows {same}:"
        " voxelize first so each voxel appears once"
    )


def raise_for_status(err: torch.Tensor, coords: torch.Tensor, what: str = "coordinate") -> None:
    """Raises the error the kernels recorded in err: the lowest status and, for it, the smallest
    row, so the same input raises the same error on every path and device. Which of two equal
    rows a parallel insert calls the duplicate depends on timing, so duplicates are named by the
    first row that has a twin, found here."""
    word = int(err.item())
    if word == NO_ERROR:
        return
    status, row = word >> ERROR_ROW_BITS, word & ((1 << ERROR_ROW_BITS) - 1)
    value = coords[row].tolist() if 0 <= row < len(coords) else None
    if status == backend.Status.OUT_OF_RANGE:
        raise CoordinateRangeError(
            f"{what} {value} at row {row} is outside the supported range: "
            f"batch in [0, {BATCH_MAX}],"
            f" x, y, z in [{COORD_MIN}, {COORD_MAX}]"
        )
    if status == backend.Status.DUPLICATE:
        raise_duplicates(coords)
    if status == backend.Status.PROBE_LIMIT:
        raise HashProbeError(
            f"hash insert of {value} (row {row}) needed more than {MAX_PROBES} probes"
        )
    raise backend.KernelError(f"hash kernel failed with status {status} at row {row}")


@dataclass(frozen=True, eq=False)
class CoordHashTable:
    """Maps (batch, x, y, z) -> row index. Build with `CoordHashTable.build(coords)`."""

    slots: torch.Tensor  # int64 [capacity, 2]: packed key, value (low 32 bits)
    num_keys: int

    @property
    def capacity(self) -> int:
        return self.slots.shape[0]

    @property
    def device(self) -> torch.device:
        return self.slots.device

    @property
    def values(self) -> torch.Tensor:
        """int32 view [capacity] of the stored values (writable)."""
        return self.slots.view(torch.int32)[:, 2]

    @classmethod
    def empty(cls, num_keys: int, device: torch.device, fill_value: int = -1) -> "CoordHashTable":
        slots = torch.full((capacity_for(num_keys), 2), EMPTY, dtype=torch.int64, device=device)
        if fill_value != -1:
            slots[:, 1] = fill_value  # high word 0, low word = fill value
        return cls(slots, num_keys)

    @classmethod
    def build(cls, coords: torch.Tensor) -> "CoordHashTable":
        """Inserts every row; duplicates and out-of-range coordinates raise CoordinateError."""
        check_coords(coords)
        coords = coords.contiguous()
        table = cls.empty(coords.shape[0], coords.device)
        err = new_error_buffer(coords.device)
        backend.call(
            "hash_build", coords.device, coords, len(coords), table.slots, table.capacity, err
        )
        raise_for_status(err, coords)
        return table

    def lookup(self, query: torch.Tensor, stride: int = 1, offsets: torch.Tensor | None = None):
        """Rows of (b, x*stride + d) for every offset d in offsets [K, 3] (default: d = 0).

        Returns (nbr int32 [K, M] with -1 for a miss, counts int64 [K] of hits)."""
        check_coords(query)
        if offsets is None:
            offsets = torch.zeros(1, 3, dtype=torch.int32)
        if len(offsets) > MAX_OFFSETS:
            raise ValueError(f"{len(offsets)} offsets; a lookup takes at most {MAX_OFFSETS}")
        offsets = offsets.to(device=self.device, dtype=torch.int32).contiguous()
        query = query.contiguous()
        nbr = torch.empty(len(offsets), len(query), dtype=torch.int32, device=self.device)
        counts = torch.empty(len(offsets), dtype=torch.int64, device=self.device)
        backend.call(
            "kmap_lookup",
            self.device,
            self.slots,
            self.capacity,
            query,
            len(query),
            stride,
            offsets,
            len(offsets),
            nbr,
            counts,
        )
        return nbr, counts
