"""What a client sees of a running service (`python -m app serve` in a subprocess on a loopback
port, LIDARSEG_CR=0.25 for speed): the `client` command's report of one frame and of a load run,
and Server-Timing's stages over a real socket, where a slow upload shows in the receive stage."""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest

from tests.conftest import last_json_line, load_frame, require_real_data, run_app

from tests.app.contract_helpers import NUSCENES, WANT_BIN
from tests.app.service_helpers import Server, parse_server_timing
from app.inference.pipeline import STAGES as REQUEST_STAGES

STAGES = {*REQUEST_STAGES, "total"}


@pytest.fixture(scope="module")
def server():
    require_real_data()
    srv = Server(max_body_bytes=4 * 1024 * 1024, max_points=150_000)
    yield srv
    assert srv.stop() == 0, srv.output()


def test_client_command(server):
    frame = str(require_real_data() / NUSCENES)
    one = run_app("client", frame, "--url", server.url)
    assert "34688 points" in one.stdout
    assert (
        sum(int(ln.split()[-1]) for ln in one.stdout.splitlines() if ln.startswith("  ")) == 34688
    )
    timing = json.loads(one.stdout.split("timing_ms ", 1)[1].splitlines()[0])
    assert STAGES <= set(timing)
    load = run_app("client", frame, "--url", server.url, "--repeat", "4", "--concurrency", "2")
    report = last_json_line(load.stdout)
    assert report["statuses"] == {"200": 4} and report["p50"] > 0 and report["throughput_rps"] > 0


def test_a_slow_upload_shows_in_the_receive_stage(server):
    """Server-Timing's stages add up to its total: the body's arrival is the receive stage (a
    0.5 s pause mid-body was in no stage before)."""
    body = np.array(load_frame(NUSCENES))[:2000].astype(np.float32).tobytes()

    def slowly():
        yield body[: len(body) // 2]
        time.sleep(0.5)
        yield body[len(body) // 2 :]

    r = httpx.post(
        f"{server.url}/v1/segment?format=nuscenes", content=slowly(), headers=WANT_BIN, timeout=60
    )
    assert r.status_code == 200, r.text
    stages = parse_server_timing(r.headers["server-timing"])
    assert stages["receive"] >= 400  # the pause
    assert sum(v for k, v in stages.items() if k != "total") >= 0.8 * stages["total"]
