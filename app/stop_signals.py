"""A stop asked for before the server listens: SIGTERM or SIGINT while the process imports torch
and builds the app (about 2 s), before uvicorn installs its own handlers.

With Python's default handling such a SIGTERM killed the process (exit status 143) and, as PID
1 of a container, where the kernel drops signals that have no handler, it was lost: a pod
deleted in its first seconds kept loading the model, then served until the grace period's
SIGKILL (exit 137, 30 s later). `python -m app` calls hold() first; the signal is recorded and
the service stops at once when it gets to it (exit status 0, app/service/server.py). The other
commands call release(): the default handling again, a signal that came meanwhile re-raised.
"""

from __future__ import annotations

import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_received: list[int] = []


def _record(sig: int, frame) -> None:
    _received.append(sig)


def hold() -> None:
    """From now until uvicorn's handlers (or release()), a stop signal is recorded, not acted on."""
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, _record)


def pending() -> int | None:
    """The first stop signal recorded since hold(), or None."""
    return _received[0] if _received else None


def release() -> None:
    """Python's default handling again (not serving); a signal recorded meanwhile raised now."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in list(_received):
        signal.raise_signal(sig)
