"""The Grafana dashboard's queries and the alert rules against a real Prometheus (Debian's
`prometheus`, on 127.0.0.1 only) scraping a real server under a short bounded load.

Grafana itself is not run here; its JSON comes from deploy/grafana/generate.py (typed builders),
and every panel query in it must return data from this Prometheus.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

from tests.app.service_helpers import Server, free_port
from tests.conftest import REPO_ROOT, load_frame, require_real_data

PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "lidarseg.json"
ALERTS = REPO_ROOT / "deploy" / "prometheus" / "lidarseg-alerts.yml"
ALERT_TESTS = REPO_ROOT / "deploy" / "prometheus" / "lidarseg-alerts.test.yml"
REQUESTS = 24

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None, reason="needs Debian's prometheus package (apt)"
)


def panel_queries() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], t["expr"]) for p in panels for t in p["targets"]]


def test_every_panel_query_follows_the_instance_variable():
    """Each replica's own figures on demand: every selector of every panel carries the
    dashboard's instance matcher (a sum over the fleet hid a slow or unready pod)."""
    dashboard = json.loads(DASHBOARD.read_text())
    (variable,) = dashboard["templating"]["list"]
    assert variable["name"] == "instance" and variable["includeAll"] and variable["multi"]
    for title, expr in panel_queries():
        selectors = re.findall(r"\b(lidarseg_\w+)(\{[^}]*\})?", expr)
        assert selectors, (title, expr)
        for metric, matchers in selectors:
            assert 'instance=~"$instance"' in matchers, (title, metric, expr)


def test_generated_files_are_current():
    pytest.importorskip("grafana_foundation_sdk")  # Python >= 3.11 (requirements/test.txt)
    r = subprocess.run(
        [sys.executable, str(REPO_ROOT / "deploy" / "grafana" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert r.returncode == 0, r.stderr


def test_promtool_checks_and_unit_tests_the_rules():
    for args in (["check", "rules", str(ALERTS)], ["test", "rules", str(ALERT_TESTS)]):
        r = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """A server, a Prometheus scraping it every second, and the trace ids of a short load."""
    require_real_data()
    srv = Server(max_batch=2)
    tmp = tmp_path_factory.mktemp("prometheus")
    port = free_port()
    (tmp / "prometheus.yml").write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(ALERTS)],
                "scrape_configs": [
                    {
                        "job_name": "lidarseg",
                        "static_configs": [{"targets": [f"127.0.0.1:{srv.port}"]}],
                    }
                ],
            }
        )
    )
    prom = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--enable-feature=exemplar-storage",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "prometheus.log").open("w"),
    )
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1", timeout=30)
    try:
        _wait(lambda: api.get("/status/buildinfo").status_code == 200, "prometheus up")
        _wait(lambda: _targets_up(api), "target scraped")
        traces = _load(srv)
        time.sleep(4)  # a few scrapes after the last request
        yield api, traces
    finally:
        api.close()
        prom.terminate()
        prom.wait(30)
        assert srv.stop() == 0, srv.output()


def _wait(cond, what: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if cond():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for: {what}")


def _targets_up(api) -> bool:
    active = api.get("/targets").json()["data"]["activeTargets"]
    return bool(active) and all(t["health"] == "up" for t in active)


def _load(srv) -> set[str]:
    """REQUESTS small frames, two at a time, and a few bad requests (4xx); returns trace ids."""
    points = np.ascontiguousarray(load_frame("semantickitti/seq00_000000.bin")[::50])
    traces = set()
    with httpx.Client(base_url=srv.url, timeout=300) as c:
        for i in range(REQUESTS):
            if i % 8 == 7:
                assert c.post("/v1/segment?format=nope", content=b"1234").status_code == 415
            r = c.post(
                "/v1/segment?format=kitti",
                content=points.tobytes(),
                headers={"Accept": "application/octet-stream"},
            )
            assert r.status_code == 200, r.text
            traces.add(r.headers["traceparent"].split("-")[1])
            time.sleep(0.25)
    _clients_give_up(srv)
    return traces


def _clients_give_up(srv) -> None:
    """Three whole frames at once from clients that wait 50 ms: the running one's answer goes
    nowhere (a wasted run), the queued ones are dropped unrun (client_gone)."""
    body = np.ascontiguousarray(load_frame("semantickitti/seq00_000000.bin")).tobytes()

    def post():
        with httpx.Client(base_url=srv.url, timeout=0.05) as c:
            try:
                c.post("/v1/segment?format=kitti", content=body)
            except httpx.TimeoutException:
                pass

    threads = [threading.Thread(target=post) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    def counted() -> bool:
        text = httpx.get(f"{srv.url}/metrics").text
        return all(
            f"{name}_total{{" in text for name in ("lidarseg_dropped", "lidarseg_wasted_runs")
        )

    _wait(counted, "a dropped frame and a wasted run counted")


@pytest.mark.parametrize("title,expr", panel_queries(), ids=lambda v: v[:60])
def test_every_panel_query_returns_data(scraped, title, expr):
    api, _ = scraped
    promql = expr.replace("$__rate_interval", "1m").replace("$instance", ".*")
    r = api.get("/query", params={"query": promql})
    assert r.status_code == 200 and r.json()["status"] == "success", r.text
    result = r.json()["data"]["result"]
    assert result, f"{title}: no data for {promql}"
    values = [float(s["value"][1]) for s in result]
    assert any(np.isfinite(v) for v in values), f"{title}: only NaN for {promql}"


def test_exemplars_reach_prometheus_with_the_trace_ids(scraped):
    api, traces = scraped
    now = time.time()
    r = api.get(
        "/query_exemplars",
        params={
            "query": 'lidarseg_stage_duration_seconds_bucket{stage="total"}',
            "start": now - 600,
            "end": now,
        },
    )
    assert r.status_code == 200, r.text
    ids = {e["labels"]["trace_id"] for series in r.json()["data"] for e in series["exemplars"]}
    assert ids and ids <= traces, (ids, traces)


def test_prometheus_loaded_the_alert_rules(scraped):
    api, _ = scraped
    groups = api.get("/rules").json()["data"]["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert {
        "LidarsegP99OverBudget",
        "LidarsegErrors",
        "LidarsegNotReady",
        "LidarsegVoxelizerFallback",
    } <= set(rules)
    assert rules["LidarsegVoxelizerFallback"]["state"] == "inactive"  # Open3D loads here
    assert all(r["health"] != "err" for r in rules.values()), rules
