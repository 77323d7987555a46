#!/usr/bin/env bash
# One-time set-up on a fresh Debian machine with Python 3.11 (idempotent, safe to re-run):
# the Debian packages Open3D, the kernel build and the virtual environment need, a virtual
# environment at .venv, the pinned requirements, and the CPU kernel library (compiled with g++;
# the CUDA one too where a GPU and nvcc exist).
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
apt_install() {
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}
missing=()
libs=$(ldconfig -p 2>/dev/null || true)
# Open3D's libraries (a bare Debian lacks libEGL and libGL; without them Open3D does not load)
for lib_pkg in libusb-1.0.so.0:libusb-1.0-0 libEGL.so.1:libegl1 libGL.so.1:libgl1; do
  grep -qF "${lib_pkg%%:*}" <<<"$libs" || missing+=("${lib_pkg#*:}")
done
command -v g++ >/dev/null 2>&1 || missing+=(g++)
# Debian's python3 leaves venv's pip (ensurepip's wheels) to the python3-venv package, which a
# fresh install lacks: `python3 -m venv` then fails (seen in a bare bookworm root)
python3 -m ensurepip --version >/dev/null 2>&1 || missing+=(python3-venv)
if [ "${#missing[@]}" -gt 0 ]; then
  apt_install "${missing[@]}"
fi
bash deploy/setup-observability.sh  # apt: prometheus + chromium for the observability tests
if [ ! -x .venv/bin/pip ]; then  # none yet, or one a failed attempt left without pip
  python3 -m venv --clear .venv
fi
# A download cut or corrupted on the way fails pip's hash check (seen once in CI: open3d's
# 400 MB wheel); pip checks every hash again, so another attempt is safe.
for attempt in 1 2 3; do
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt && break
  [ "$attempt" = 3 ] && { echo "pip install failed 3 times" >&2; exit 1; }
  echo "pip install failed (attempt $attempt of 3): trying again" >&2
done
.venv/bin/python -m kernels.build >/dev/null
