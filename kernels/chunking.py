"""Bounded scratch memory: a plan's buffer rows in chunks under a byte cap.

Gather-matmul-scatter needs, for every buffer row it has in flight, a gathered input row (Cin) and
a partial output row (Cout). Unchunked, that is the whole map at once (gigabytes for a 2M-point
frame; README.md, Engine, has the figures). The engine instead walks the rows in chunks of at most
`rows_under_cap(...)` rows: whole launches while they fit, else a launch's offsets one by one, in
slices of rows where one offset alone exceeds the cap. Chunks keep the plan's row order, so every
output row receives its contributions in the same order as unchunked; only a launch split into
smaller matmuls may round differently (a bmm's rows computed as mm).

The cap (EngineConfig.memory_cap, bytes) defaults to LIDARSEG_ENGINE_SCRATCH_MB when set, else a
quarter of the CUDA device's free memory (read at most every FREE_MEMORY_TTL_S, rounded down to a
power of two), or 256 MiB on the CPU. A deterministic engine's default on CUDA is an eighth of the
device's total memory instead: a cap that followed free memory could split the same conv into other
matmuls from one frame to the next (torch's cache grows after the first), and so round differently.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from .grouping import ExecutionPlan

CPU_DEFAULT_CAP = 256 << 20
CUDA_FREE_SHARE = 4  # the cap is 1/4 of the free device memory
CUDA_TOTAL_SHARE = 8  # deterministic: 1/8 of the device's memory, whatever is free
MIN_CAP = 1 << 20  # never plan for less than 1 MiB of scratch by default


def default_cap(device: torch.device, deterministic: bool = False) -> int:
    """Scratch bytes a conv may use on `device` when EngineConfig.memory_cap is None."""
    env = os.environ.get("LIDARSEG_ENGINE_SCRATCH_MB")
    if env:
        return int(float(env) * (1 << 20))
    if device.type == "cuda":
        free, total = _cuda_memory(device)
        share = total // CUDA_TOTAL_SHARE if deterministic else free // CUDA_FREE_SHARE
        # a power of two, so the chunking (cached per plan and cap) stays put while free
        # memory drifts from call to call
        return 1 << max(share, MIN_CAP).bit_length() - 1
    return CPU_DEFAULT_CAP


FREE_MEMORY_TTL_S = 0.5  # how long one reading of the device's free memory serves
_free_readings: dict[torch.device, tuple[float, tuple[int, int]]] = {}


def _cuda_memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of a CUDA device, read at most once per FREE_MEMORY_TTL_S: every conv
    asks, and on the H200 one reading (cudaMemGetInfo) cost 34 us, 1.7 ms of a 54 ms forward."""
    device = torch.device(
        "cuda", torch.cuda.current_device() if device.index is None else device.index
    )
    now = time.monotonic()
    read_at, memory = _free_readings.get(device, (-FREE_MEMORY_TTL_S, (0, 0)))
    if now - read_at >= FREE_MEMORY_TTL_S:
        memory = tuple(torch.cuda.mem_get_info(device))  # type: ignore[assignment]
        _free_readings[device] = (now, memory)
    return memory


def rows_under_cap(cap_bytes: int, cin: int, cout: int, dtype: torch.dtype) -> int:
    """Buffer rows whose gathered input and partial output fit in cap_bytes (at least 1)."""
    per_row = (cin + cout) * torch.empty((), dtype=dtype).element_size()
    return max(int(cap_bytes) // per_row, 1)


@dataclass(frozen=True)
class Piece:
    """One matmul: rows [start, start + len(kernel_indices) * height) of the buffer, `height`
    rows per offset (several offsets: one bmm; one offset: one mm over some of its rows)."""

    start: int
    kernel_indices: tuple[int, ...]
    height: int
    # where its offsets sit in the plan's launch-order weight stack (ExecutionPlan.kernel_order),
    # for a piece of several offsets (a whole launch)
    stack_at: int = -1

    @property
    def rows(self) -> int:
        return len(self.kernel_indices) * self.height

    def segments(self):
        """(kernel index, first row, rows) per offset of the piece."""
        for j, k in enumerate(self.kernel_indices):
            yield k, self.start + j * self.height, self.height


@dataclass(frozen=True)
class Chunk:
    start: int
    rows: int
    pieces: tuple[Piece, ...]


def _pieces(plan: ExecutionPlan, max_rows: int):
    stack_at = 0  # offsets of the launches before this one
    for launch in plan.launches:
        at, stack_at = stack_at, stack_at + len(launch.kernel_indices)
        if launch.rows <= max_rows:
            yield Piece(launch.start, launch.kernel_indices, launch.height, at)
            continue
        for j, k in enumerate(launch.kernel_indices):
            first = launch.start + j * launch.height
            for lo in range(0, launch.height, max_rows):
                yield Piece(first + lo, (k,), min(max_rows, launch.height - lo))


def chunks(plan: ExecutionPlan, max_rows: int, per_launch: bool = False) -> list[Chunk]:
    """The plan's buffer rows as consecutive chunks of at most max_rows rows. per_launch: never
    two launches in one chunk (the CPU scatters launch by launch to stay in cache)."""
    key = (max_rows, per_launch)
    if key in plan.chunk_cache:
        return plan.chunk_cache[key]
    out: list[Chunk] = []
    current: list[Piece] = []

    def flush():
        if current:
            start = current[0].start
            out.append(Chunk(start, current[-1].start + current[-1].rows - start, tuple(current)))
            current.clear()

    for piece in _pieces(plan, max_rows):
        used = piece.start - current[0].start if current else 0
        if current and (per_launch or used + piece.rows > max_rows):
            flush()
        current.append(piece)
    flush()
    plan.chunk_cache[key] = out
    return out


class Workspace:
    """Scratch buffers reused across inference calls (per thread, per device and dtype).

    Gather buffers of a large frame are tens of MB; allocating them fresh each call costs more in
    page faults than the matmuls (measured 17 ms for 65 MB on the CPU). Buffers are only reused
    when no autograd graph keeps them alive (inference)."""

    def __init__(self):
        self._local = threading.local()

    def memo(self) -> dict:
        """This thread's dict for what one call leaves for the next (kernels/int8.py keeps the
        last quantized input, and the outputs int8 convs quantized as they made them, there)."""
        return self._local.__dict__.setdefault("memo", {})

    def flag(self, slot: int) -> tuple[torch.Tensor, np.ndarray]:
        """An int64 [1] flag for a kernel to set, cleared: the tensor to pass and a numpy view of
        it to read (a numpy read and write, where torch.zeros and .item() cost about 5 us a conv
        in a frame's Python)."""
        flags = self._local.__dict__.setdefault("flags", {})
        made = flags.get(slot)
        if made is None:
            array = np.zeros(1, np.int64)
            made = flags[slot] = (torch.from_numpy(array), array)
        made[1][0] = 0
        return made

    def get(
        self,
        slot: int,
        rows: int,
        cols: int,
        dtype: torch.dtype,
        device: torch.device,
        max_rows: int | None = None,
    ) -> torch.Tensor:
        """A [rows, cols] view of buffer `slot`, grown with 25% slack (up to max_rows rows)."""
        buffers = self._local.__dict__.setdefault("buffers", {})
        key = (slot, dtype, device)
        flat = buffers.get(key)
        if flat is None or flat.numel() < rows * cols:
            flat = buffers.pop(key, None)
            del flat  # free the old buffer before the new one is allocated
            slack = rows * 5 // 4 if max_rows is None else min(rows * 5 // 4, max_rows)
            size = max(slack, rows) * cols
            flat = torch.empty(max(size, 1), dtype=dtype, device=device)
            buffers[key] = flat
        # the first rows * cols values as [rows, cols]: one op (a slice and a view cost two,
        # and this runs a few times for every conv of a frame)
        return flat.as_strided((rows, cols), (cols, 1))
