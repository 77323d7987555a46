"""A real server for the service tests: `python -m app serve` in a subprocess on a loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

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
