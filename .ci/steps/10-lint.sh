#!/usr/bin/env bash
# Lint (ruff) and type check (mypy) of app/, models/ and kernels/ Python, configured in
# pyproject.toml; any finding fails the step. (`ruff format --check` joins once the tree has been
# formatted in one pass.)
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/ruff check app models kernels
.venv/bin/mypy
