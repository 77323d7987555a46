"""A stop asked for before the server listens: SIGTERM or SIGINT while the process imports torch
and builds the app (about 2 s), before uvicorn installs its own handlers.

With Python's default handling such a SIGTERM killed the process (exit status 143) and, as PID
1 of a container, where the kernel drops signals that have no handler, it was lost: a pod
deleted in its first seconds kept loading the model, then served until the grace period's
SIGKILL (exit 137, 30 s later). `python -m app` calls hold() first; the signal is recorded and
the service stops at once when it gets to it (exit status 0, app/service/server.py), which puts
the former handlers back (restore()) once uvicorn is done. The other commands call release():
the former handling again (as before: the default's, unless the parent ignored the signal), a
signal that came meanwhile raised again. A signal the parent set to be ignored (`cmd &` in a
shell ignores SIGINT) stays ignored.
"""

from __future__ import annotations

import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_received: list[int] = []
_former: dict[int, object] = {}  # the handlers hold() replaced


def _record(sig: int, frame) -> None:
    _received.append(sig)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def hold() -> None:
    """From now until uvicorn's handlers (or release()), a stop signal is recorded, not acted on."""
    if not _main_thread():
        return
    for sig in STOP_SIGNALS:
        former = signal.getsignal(sig)
        if former is not signal.SIG_IGN:
            _former[sig] = former
            signal.signal(sig, _record)


def received() -> list[int]:
    """The stop signals recorded since hold(), oldest first."""
    return list(_received)


def restore() -> None:
    """The handlers hold() replaced, back (nothing raised)."""
    if not _main_thread():
        return
    for sig, former in _former.items():
        signal.signal(sig, former)  # type: ignore[arg-type]
    _former.clear()


def release() -> None:
    """Not serving: the former handling back, and a signal recorded meanwhile raised now (a
    no-op where hold() did not run: an in-process caller keeps its own handlers)."""
    if not _former or not _main_thread():
        return
    restore()
    pending, _received[:] = list(_received), []
    for sig in pending:
        signal.raise_signal(sig)
