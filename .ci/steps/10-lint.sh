#!/usr/bin/env bash
# ci-lane: lint
# Lint and format check (ruff) of every Python file, and the type check (mypy) of app/, models/
# and kernels/, all configured in pyproject.toml; any finding fails the step.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY_DIRS=(app models kernels bench train synth tests deploy)
.venv/bin/ruff check "${PY_DIRS[@]}"
.venv/bin/ruff format --check "${PY_DIRS[@]}"
.venv/bin/mypy
