"""One access-log line per request, written straight to stderr (no logging machinery: cheap).

Mode `auto` writes JSON (one object per line, for a container's log collector) unless stderr is
a terminal, where it writes plain text. Fields: time, request id, trace id, client address,
method, path (never the query string), status, format, points, voxels, ignored points, cleaned
points, batch size and every stage in ms. Never point data, never a header (so never an API key).

Probes, /metrics, the dashboard and its JSON are logged only when they fail (status >= 400), so
a scraper or an open dashboard does not drown the requests that matter.
"""

from __future__ import annotations

import json
import logging
import sys
import time

QUIET_PREFIXES = (
    "/healthz",
    "/readyz",
    "/metrics",
    "/dashboard",
    "/static/",
    "/v1/requests",
    "/docs",
    "/openapi.json",
    "/favicon.ico",
)
FIELDS = (
    "error",  # an error answer's code (the JSON body's 'error': queue_full, bodies_busy, ...)
    "format",
    "points",
    "voxels",
    "ignored_points",
    "cleaned_points",
    "batch_size",
)


def resolved_mode(mode: str, stream=None) -> str:
    """LIDARSEG_ACCESS_LOG with auto resolved: text on a terminal, else json."""
    stream = stream if stream is not None else sys.stderr
    if mode == "auto":
        return "text" if getattr(stream, "isatty", lambda: False)() else "json"
    return mode


class JsonLogFormatter(logging.Formatter):
    """The service's and uvicorn's log records as one JSON object a line, beside the JSON access
    log (a log collector mis-read plain-text lines and multi-line tracebacks among them)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, separators=(",", ":"))


class AccessLog:
    def __init__(self, mode: str = "auto", stream=None):
        stream = stream if stream is not None else sys.stderr
        self.mode, self.stream = resolved_mode(mode, stream), stream

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def write(
        self,
        method: str,
        path: str,
        status: int,
        client: str | None,
        request_id: str | None,
        trace_id: str,
        stages_ms: dict[str, float],
        info: dict,
    ) -> None:
        if self.mode == "off" or (status < 400 and path.startswith(QUIET_PREFIXES)):
            return
        line = self.format(method, path, status, client, request_id, trace_id, stages_ms, info)
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stderr must not fail the request
            pass

    def format(self, method, path, status, client, request_id, trace_id, stages_ms, info) -> str:
        if self.mode == "json":
            entry = {
                "time": round(time.time(), 3),
                "request_id": request_id,
                "trace_id": trace_id,
                "client": client,
                "method": method,
                "path": path,
                "status": status,
                **{k: info.get(k) for k in FIELDS},
                "stages_ms": {k: round(v, 3) for k, v in stages_ms.items()},
            }
            return json.dumps(entry, separators=(",", ":"))
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        path = json.dumps(path)[1:-1]  # a decoded %0a or '"' in a path cannot forge a line
        extra = " ".join(f"{k}={info[k]}" for k in FIELDS if info.get(k) is not None)
        stages = " ".join(f"{k}={v:.1f}" for k, v in stages_ms.items())
        return (
            f'{stamp}Z {client or "-"} "{method} {path}" {status} '
            f"rid={request_id or '-'} trace={trace_id} {extra} {stages} ms"
        ).replace("  ", " ")
