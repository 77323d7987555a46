#!/usr/bin/env bash
# What the observability tests need from Debian (idempotent): `prometheus` (with promtool) for
# tests/deploy/test_prometheus.py, and `chromium` for tests/app/test_dashboard_browser.py, which
# Playwright's Python API drives as the system browser (no browser download). Run by setup.sh.
set -euo pipefail
if command -v prometheus >/dev/null && command -v promtool >/dev/null \
    && command -v chromium >/dev/null; then
  exit 0
fi
SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
  prometheus chromium >/dev/null
