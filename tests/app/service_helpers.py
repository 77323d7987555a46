"""A real server for the service tests: `python -m app serve` in a subprocess on a loopback port,
raw connections to it and their responses, and the limits tests' shared server (the `srv`
fixture)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import REPO_ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """Starts the service with LIDARSEG_* settings from `env`; waits for /readyz == 200."""

    def __init__(self, **env: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "LIDARSEG_CR": "0.25",
            "LIDARSEG_WEIGHTS": "random",
            "LIDARSEG_LOG_LEVEL": "warning",
            **{f"LIDARSEG_{k.upper()}": str(v) for k, v in env.items()},
        }
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--port", str(self.port), "--device", "cpu"],
            cwd=REPO_ROOT,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.wait_ready()

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def wait_ready(self, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not ready within {timeout} s:\n{self.output()}")

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120, **kwargs)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


from app.client import metric_value  # noqa: E402,F401
from app.client import server_timing as parse_server_timing  # noqa: E402,F401


def connect(srv: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=30)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection (the socket's timeout fails the test).
    A close with bytes of ours unread is a reset (RST), after the data it sent: the end too."""
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not chunk:
            return out
        out += chunk


def status_and_body(raw: bytes) -> tuple[int, dict, bytes]:
    """A raw HTTP response's status, headers (lower-case names) and body."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


LIMITS_KEY = "limits-key-0123456789"


@pytest.fixture(scope="module", name="srv")
def limits_server() -> Iterator[Server]:
    """The `srv` fixture of the modules that import it: a server with tight limits at the HTTP
    edge, LIMITS_KEY its API key, shared by the module's tests; at their end no route has
    answered a 500, and it exits with status 0."""
    s = Server(
        body_timeout_s=2,
        header_timeout_s=2,
        idle_timeout_s=3,  # longer than the header timeout: it must still rule between requests
        max_connections=6,
        decode_concurrency=2,
        max_bodies_bytes=100 * 1024 * 1024,
        api_keys=LIMITS_KEY,
    )
    yield s
    try:
        assert no_500_answered(s), s.output()[-2000:]
    finally:  # stopped even when a route answered a 500 (no server left behind)
        assert s.stop() == 0, s.output()


def no_500_answered(srv: Server) -> bool:
    """Whether the server's metrics count no response with status 500."""
    return 'status="500"' not in httpx.get(f"{srv.url}/metrics").text


def connection_rejects(srv: Server, reason: str) -> float:
    """Connections the server turned away for `reason` before any route (its metrics)."""
    text = httpx.get(f"{srv.url}/metrics").text
    return metric_value(text, "lidarseg_connection_rejects_total", f'reason="{reason}"')
