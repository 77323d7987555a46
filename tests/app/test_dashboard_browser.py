"""The built-in dashboard and /docs in a real headless Chromium (Debian's `chromium`, driven by
Playwright's Python API; no browser download), against a real server process.

Saves screenshots under artifacts/ (LIDARSEG_ARTIFACTS to change): dashboard.png, docs.png.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.codecs.files import infer_format
from tests.app.service_helpers import Server, parse_server_timing
from tests.conftest import REPO_ROOT, load_frame, require_real_data
from app.inference.pipeline import STAGES

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(os.environ.get("LIDARSEG_ARTIFACTS", REPO_ROOT / "artifacts"))
BACKGROUND = (0x10, 0x14, 0x1C)

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt)")


@pytest.fixture(scope="module")
def server():
    require_real_data()
    srv = Server()
    yield srv
    assert srv.stop() == 0, srv.output()


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader"],
        )
        yield b
        b.close()


@pytest.fixture()
def page(browser):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.errors = errors
    yield page
    page.close()


def non_background_pixels(page) -> int:
    """Pixels of the 3D canvas that differ from its background colour."""
    return page.evaluate(
        """([r, g, b]) => {
        const src = document.getElementById('cloud');
        const c = document.createElement('canvas');
        c.width = src.width; c.height = src.height;
        const ctx = c.getContext('2d');
        ctx.drawImage(src, 0, 0);
        const d = ctx.getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4)
            if (Math.abs(d[i] - r) + Math.abs(d[i + 1] - g) + Math.abs(d[i + 2] - b) > 30) n++;
        return n;
    }""",
        list(BACKGROUND),
    )


def test_dashboard_shows_a_posted_frame(server, page, tmp_path):
    points = np.ascontiguousarray(load_frame("semantickitti/seq00_000000.bin")[::20])
    page.goto(f"{server.url}/dashboard")
    page.wait_for_selector("#held:not(:text('-'))")
    assert non_background_pixels(page) == 0  # nothing drawn yet
    r = httpx.post(
        f"{server.url}/v1/segment?format=kitti",
        content=points.tobytes(),
        headers={
            "Content-Type": "application/octet-stream",
            "Accept": "application/octet-stream",
            "X-Request-Id": "browser-1",
        },
        timeout=300,
    )
    assert r.status_code == 200, r.text
    timing = parse_server_timing(r.headers["server-timing"])
    row = page.locator("tr[data-id='browser-1']")  # the table is redrawn each poll
    row.wait_for(timeout=30_000)
    assert row.locator("td.points").inner_text() == str(len(points))
    assert row.locator("td.status").inner_text() == "200"
    row.click()
    page.wait_for_selector("#view-note:text('points')", timeout=30_000)
    for stage in STAGES:
        shown = page.inner_text(f"#waterfall .row[data-stage='{stage}'] .ms")
        assert float(shown) == pytest.approx(timing[stage], abs=0.006), stage
    assert page.inner_text("#view-note") == f"{len(points)} points"
    legend = page.query_selector_all("#legend li .n")
    assert sum(int(n.inner_text()) for n in legend) == len(points)
    assert non_background_pixels(page) > 500  # the cloud is drawn
    page.mouse.move(1000, 600)  # orbit: the view changes
    before = page.query_selector("#cloud").screenshot()
    page.mouse.down()
    page.mouse.move(1100, 650, steps=5)
    page.mouse.up()
    assert page.query_selector("#cloud").screenshot() != before

    # a file given to the page (the drop zone's file input) is segmented and selected
    frame = tmp_path / "frame.bin"
    frame.write_bytes(points[:3000].tobytes())
    page.set_input_files("#file", str(frame))
    page.wait_for_function(  # every outcome starts with the name
        "document.getElementById('status').textContent.startsWith('frame.bin:')", timeout=120_000
    )
    assert page.inner_text("#status") == "frame.bin: 3000 points segmented", page.errors
    assert page.inner_text("#view-note") == "3000 points"
    # an Ouster scan's name: posted as the command line reads it (0..255 intensities), not kitti
    ouster = tmp_path / "os1-128_scan0.bin"
    ouster.write_bytes(points[:2000].tobytes())
    page.set_input_files("#file", str(ouster))
    page.wait_for_function(
        "document.getElementById('status').textContent.startsWith('os1-128_scan0.bin: 2000')",
        timeout=120_000,
    )
    newest = httpx.get(f"{server.url}/v1/requests?limit=1").json()["requests"][0]
    assert (newest["points"], newest["format"]) == (2000, infer_format(ouster)) == (2000, "ouster")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    assert page.errors == []


def test_docs_render_offline(server, page):
    page.route(
        "**/*",
        lambda route: (
            route.abort() if not route.request.url.startswith(server.url) else route.continue_()
        ),
    )  # nothing outside the app loads
    page.goto(f"{server.url}/docs")
    page.wait_for_selector(".swagger-ui .info .title", timeout=30_000)
    assert "lidarseg" in page.inner_text(".swagger-ui .info .title")
    assert page.query_selector_all(".opblock")  # the operations are listed
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "docs.png"))
    assert page.errors == []


def test_dashboard_with_api_keys(browser, tmp_path):
    """Keys set: the browser is asked for one (Basic: any user, the key as password); with it
    the page, its JSON and a dropped frame all work; without it nothing but the 401."""
    require_real_data()
    key = "browser-key-0123456789"
    srv = Server(api_keys=key)
    try:
        r = httpx.get(f"{srv.url}/dashboard")  # what makes a browser ask for the key
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")
        context = browser.new_context(http_credentials={"username": "me", "password": key})
        page = context.new_page()
        errors = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        assert page.goto(f"{srv.url}/dashboard").status == 200
        page.wait_for_selector("#held:not(:text('-'))")
        frame = tmp_path / "frame.bin"
        frame.write_bytes(
            np.ascontiguousarray(load_frame("semantickitti/seq00_000000.bin")[::40]).tobytes()
        )
        page.set_input_files("#file", str(frame))
        page.wait_for_selector("#view-note:text('points')", timeout=120_000)
        assert page.locator("#requests tbody tr").count() == 1
        assert errors == []
        context.close()
    finally:
        assert srv.stop() == 0, srv.output()
