#!/usr/bin/env bash
# The whole test suite on the Orin image's Python and torch: Python 3.10 (JetPack 6's) and the
# torch its Dockerfile pins (deploy/jetson/Dockerfile's TORCH_SPEC). CI runs only
# tests/test_python310.py (patterns compiled by a 3.10); this runs everything, on this x86-64
# machine:
#  - a venv at $PY310_VENV (.venv310) from pyenv's Python 3.10 (or python3.10 on PATH);
#  - torch from PyPI: no CPU wheel for 3.10 is reachable here, and PyPI's x86-64 wheel is a CUDA
#    build (about 4 GB with its NVIDIA libraries), which runs on a CPU;
#  - requirements/service.txt, test.txt and crosscheck.txt (their python_version < "3.11" pins
#    are the Jetson image's), then the kernels and pytest with any arguments given.
# Not a CI step: the download, and about 8 minutes of both cores for the run.
#   bash deploy/python310_check.sh [PYTEST ARGS]      # e.g. -x tests/app
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PY310_VENV:-.venv310}
TORCH=${TORCH_SPEC:-$(sed -n 's/^ARG TORCH_SPEC="\(.*\)"$/\1/p' deploy/jetson/Dockerfile)}
PY310=""
for candidate in "$HOME"/.pyenv/versions/3.10*/bin/python "$(command -v python3.10 || true)"; do
  if [ -x "$candidate" ] && "$candidate" -c "" 2>/dev/null; then PY310=$candidate; break; fi
done
[ -n "$PY310" ] || { echo "no Python 3.10 (pyenv install 3.10, or python3.10 on PATH)" >&2; exit 1; }
[ -x "$VENV/bin/pip" ] || "$PY310" -m venv --clear "$VENV"
echo "$("$VENV/bin/python" --version), $TORCH from PyPI, venv $VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check \
  "$TORCH" -r requirements/service.txt -r requirements/test.txt -r requirements/crosscheck.txt
"$VENV/bin/python" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__)"
"$VENV/bin/python" -m kernels.build >/dev/null
exec "$VENV/bin/python" -m pytest -q -rs "$@"
