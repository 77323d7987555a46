"""Deferred CPU kernel calls: a frame's convs run back to back instead of one per return to Python.

Between two kernels of a frame's network Python does about 50 us of work when warm, and 0.1 to
0.4 ms right after a kernel that evicted its working set from the caches; meanwhile the second
OpenMP thread outlasts its spin (app/threads.py) and has to be woken for the next kernel. Within
`calls_deferred()`, the kernels in DEFERRABLE (the convs and the quantizers, whose outputs Python
only hands on to later kernels) are checked and converted as they are called (kernels/backend.py)
but run later, in call order, each with the tensors it was given kept alive until then.
`settle()` runs the pending calls; it runs by itself at the end of the block, once MAX_PENDING
calls wait, and before any other kernel runs. Code that lets torch read rows a kernel wrote runs
in `eager()` (pending calls first, nothing deferred inside), and code that reads a flag a kernel
sets calls `settle()` first.

One flag is not read that way: the int8 conv's "these rows could not be quantized" (a NaN or an
infinity among them), which Python would read right after every conv to choose how the next one
reads its input. While its conv waits the flag is assumed clear (`check_after` records it), and
`settle()` raises AssumptionFailed when one is set once the calls have run: the frame's results
are then wrong, and the caller runs it again without deferral (the pipeline's network stage).

Errors: a call with bad arguments raises where it is made, as without deferral; a kernel that
returns a bad status raises KernelError (naming it) from the settle() that ran it, and the
calls after it are dropped. Per thread; inert where autograd records (training never defers).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import numpy as np
import torch

# ops (kernels/backend.py names) whose outputs no Python code reads before a later kernel does
DEFERRABLE = frozenset(
    {
        "fused_conv_f32",
        "fused_conv_bf16",
        "fused_conv_bf16_tiles",
        "fused_conv_int8",
        "quantize_rows_u8",
        "quantize_concat_u8",
    }
)
# calls that may wait at once: each holds its tensors (a conv's output rows among them), so this
# bounds the memory that waiting adds. The default model makes 43 calls a frame, whose waits end
# at its one quantizer's flag and at the end of the stage: peak RSS over five KITTI frames 565
# MB against 558 MB call by call (16 at a time: 562 MB, and less of the gain)
MAX_PENDING = 64


class AssumptionFailed(RuntimeError):
    """A flag assumed clear while its kernel waited (check_after) was set: run again, eagerly."""


class _State(threading.local):
    def __init__(self) -> None:
        # pending (name, fn, c_args, args, raise_for(name, status)); None: not deferring
        self.calls: list | None = None
        self.checks: list[np.ndarray] = []  # flags that must read 0 once the calls have run
        self.eager = 0  # depth of eager() blocks


_state = _State()


def pending() -> list | None:
    """The list a deferrable call joins, or None where calls run at once (kernels/backend.py)."""
    return None if _state.eager else _state.calls


def deferring() -> bool:
    return pending() is not None


def check_after(flag: np.ndarray) -> None:
    """flag[0] (set by a pending kernel) must be 0 once the pending calls have run."""
    _state.checks.append(flag)


def settle() -> None:
    """Runs the pending calls in order; raises KernelError for a bad status (the calls after it
    dropped) and AssumptionFailed for a flag check_after recorded that is set."""
    calls, checks = _state.calls, _state.checks
    if not calls and not checks:
        return
    run = list(calls) if calls else []
    if calls:
        calls.clear()
    _state.checks = []
    for name, fn, c_args, _args, raise_for in run:
        raise_for(name, fn(*c_args))
    if any(flag[0] for flag in checks):
        raise AssumptionFailed("a kernel could not do what Python assumed it would while it waited")


def contiguous(rows: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """rows (as dtype) contiguous: rows itself where it already is, else a copy made once the
    pending calls have run (a copy reads the rows, which a waiting kernel may still write)."""
    if rows.is_contiguous() and (dtype is None or rows.dtype == dtype):
        return rows
    settle()
    return (rows if dtype is None else rows.to(dtype)).contiguous()


@contextlib.contextmanager
def calls_deferred() -> Iterator[None]:
    """Within: deferrable CPU kernel calls wait and run together (settled on the way out, or
    dropped if the block raises). Nested blocks are one block; no deferral where autograd
    records."""
    if _state.calls is not None or torch.is_grad_enabled():
        yield
        return
    _state.calls, _state.checks = [], []
    try:
        yield
        settle()
    finally:
        _state.calls, _state.checks = None, []


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Within: pending calls have run, and calls run at once (torch reads what kernels wrote)."""
    settle()
    _state.eager += 1
    try:
        yield
    finally:
        _state.eager -= 1
