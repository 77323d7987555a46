#!/usr/bin/env bash
# One-time set-up on a fresh Debian machine with Python 3.11 (idempotent, safe to re-run):
# the Debian package Open3D needs, a virtual environment at .venv, the pinned requirements, and
# the CPU kernel library (compiled with g++; the CUDA one too where a GPU and nvcc exist).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! ldconfig -p 2>/dev/null | grep -q libusb-1.0.so.0 || ! command -v g++ >/dev/null 2>&1; then
  SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq libusb-1.0-0 g++ >/dev/null
fi
bash deploy/setup-observability.sh  # apt: prometheus + chromium for the observability tests
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# A download cut or corrupted on the way fails pip's hash check (seen once in CI: open3d's
# 400 MB wheel); pip checks every hash again, so another attempt is safe.
for attempt in 1 2 3; do
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt && break
  [ "$attempt" = 3 ] && { echo "pip install failed 3 times" >&2; exit 1; }
  echo "pip install failed (attempt $attempt of 3): trying again" >&2
done
.venv/bin/python -m kernels.build >/dev/null
