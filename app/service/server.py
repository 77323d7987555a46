"""uvicorn, hardened (app/service/guard.py: header and idle timeouts, a connection cap, JSON
answers before any route) and one shutdown budget.

Shutdown (SIGTERM / SIGINT): one budget, LIDARSEG_SHUTDOWN_BUDGET_S (25 s, under Kubernetes'
default 30 s grace period), from the signal to the exit. At once: readiness turns 503, new
requests get 503 draining, uploads still arriving are answered 503 draining and closed (a clean
status, not a 500). Requests already decoded run on until the budget's drain part ends
(budget - CLOSE_RESERVE_S); then uvicorn closes connections (at most GRACEFUL_S) and the lifespan
stops the worker with what is left. A second signal exits at once. A signal before uvicorn
listens (app/stop_signals.py holds it from the process's first line): exit status 0 at once if
no app is built yet, else a drain as soon as it serves.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Callable

import uvicorn
from uvicorn.config import LOGGING_CONFIG
from pydantic import ValidationError

from app import stop_signals
from app.service.access_log import JsonLogFormatter, resolved_mode
from app.service.config import Settings, unread_variables
from app.service.guard import GuardedConfig, GuardedH11, Rejected
from app.service.read_ahead import READ_AHEAD_BYTES
from app.service.tracing import checked_export

CLOSE_RESERVE_S = 5.0  # of the shutdown budget, kept for closing connections and the lifespan
GRACEFUL_S = 3  # uvicorn's own graceful close, inside the reserve (whole seconds: uvicorn's int)


# How long a thread may keep the GIL while another waits for it (Python's default: 5 ms). The
# event loop takes the GIL a dozen times or more to answer one probe; with decoder threads busy
# in Python, each handover can cost the whole interval. The threads doing the heavy work (torch,
# our kernels, numpy) run with the GIL released, so a shorter interval does not slow them.
GIL_SWITCH_S = 0.001


def uvicorn_config(
    app, settings: Settings, on_reject: Callable[[Rejected], object] = lambda rejected: None
) -> GuardedConfig:
    """uvicorn's config for `app`, with GuardedH11's limits; on_reject(Rejected) for every
    connection answered before any route."""
    config = GuardedConfig(
        app,
        host=settings.host,
        port=settings.port,
        lifespan="on",
        http=GuardedH11,
        log_level=settings.log_level,
        timeout_keep_alive=max(1, round(settings.idle_timeout_s)),
        timeout_graceful_shutdown=GRACEFUL_S,
        h11_max_incomplete_event_size=64 * 1024,
        access_log=False,  # ours (access_log.py, LIDARSEG_ACCESS_LOG); off means none at all
        # JSON logs: uvicorn's loggers keep no handlers of their own and reach the root's
        log_config=None if resolved_mode(settings.access_log) == "json" else LOGGING_CONFIG,
    )
    config.lidarseg_guard = {
        "max_connections": settings.max_connections,
        "read_ahead_bytes": min(READ_AHEAD_BYTES, settings.max_body_bytes),
        "header_timeout_s": settings.header_timeout_s,
        "retry_after_s": settings.retry_after_s,
        "on_reject": on_reject,
    }
    return config


def run(app) -> int:
    """Serves `app` (create_app's) until a signal, within the shutdown budget; exit status 0, or
    3 when the service can never serve (ServiceState.fatal_error: the model failed to load, the
    worker's thread ended), noticed within uvicorn's 0.1 s tick."""
    service = app.state.service
    settings = service.settings

    class DrainingServer(uvicorn.Server):
        fatal: str | None = None  # ServiceState.fatal_error, once seen
        early_handled = 0  # of stop_signals.received()

        def handle_exit(self, sig, frame):
            if service.draining:  # second signal: stop now
                self.should_exit = self.force_exit = True
                return
            service.begin_drain(time.monotonic() + settings.shutdown_budget_s)
            threading.Thread(target=self._drain, daemon=True).start()

        def _drain(self):
            end = service.shutdown_deadline - CLOSE_RESERVE_S
            while time.monotonic() < end:
                with service.lock:
                    busy = service.in_flight
                if not busy and (service.worker is None or service.worker.idle):
                    break
                time.sleep(0.02)
            self.should_exit = True

        async def on_tick(self, counter: int) -> bool:
            # signals recorded after serve()'s look, before uvicorn's handlers: each acted on
            # once (a second one exits at once, as through uvicorn's handler)
            for early in stop_signals.received()[self.early_handled :]:
                self.early_handled += 1
                self.handle_exit(early, None)
            if self.fatal is None and service.fatal_error is not None:
                self.fatal = service.fatal_error
                logging.getLogger("lidarseg").error("exiting: %s", self.fatal)
                self.should_exit = True  # fail fast: a restart, not a pod that is never ready
            return await super().on_tick(counter)

    def on_reject(rejected: Rejected) -> None:
        service.metrics.connection_rejects.labels(reason=rejected.code).inc()
        if service.observe is not None:  # the request line never reached a route: "-" for it
            service.observe.access_log.write(
                "-", "-", rejected.status, rejected.client, rejected.request_id, "-",
                {"total": rejected.total_ms}, {"error": rejected.code},
            )  # fmt: skip

    server = DrainingServer(uvicorn_config(app, settings, on_reject))
    try:
        server.run()
    finally:  # uvicorn put back what it found, our recorder: the former handlers instead
        stop_signals.restore()
    return 0 if server.fatal is None else 3


def serve(overrides: dict) -> int:
    """Runs uvicorn on create_app(Settings(env + overrides)): the one entry the command line
    (`python -m app serve`) starts the service through. SIGTERM / SIGINT: readiness turns 503
    and new work is refused, in-flight requests finish, all within LIDARSEG_SHUTDOWN_BUDGET_S;
    exit status 0. A second signal exits at once. Bad settings: exit status 2; a model that
    fails to load (a corrupt weights file, a failed warm-up) or a worker thread that ends:
    exit status 3."""
    from app.service.main import create_app

    try:
        settings = Settings(**overrides)
        checked_export(os.environ)  # tracing's OTEL_* variables
    except (ValidationError, ValueError) as e:
        print(f"lidarseg: bad settings:\n{e}", file=sys.stderr)
        return 2
    json_logs = resolved_mode(settings.access_log) == "json"
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if json_logs:  # every line of stderr one JSON object, uvicorn's too (uvicorn_config)
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonLogFormatter())
    for warning in unread_variables(os.environ):
        logging.getLogger("lidarseg").warning(warning)
    sys.setswitchinterval(GIL_SWITCH_S)
    early = stop_signals.received()
    if early:  # a pod deleted while it started: no model loaded, nothing to drain
        stop_signals.restore()
        logging.getLogger("lidarseg").info("%s before serving; bye", signal.Signals(early[0]).name)
        return 0
    return run(create_app(settings))
