"""What the docs tests share: the documents (README.md, docs/, deploy/), their text, and the
paths they are named by in a failure."""

from __future__ import annotations

import functools
from pathlib import Path

from tests.conftest import REPO_ROOT

README = REPO_ROOT / "README.md"
DOCS = [README, *sorted((REPO_ROOT / "docs").glob("*.md"))]
DEPLOY = [
    p
    for p in sorted((REPO_ROOT / "deploy").rglob("*"))
    if p.is_file()
    and (p.suffix in {".yaml", ".yml", ".sh", ".json", ".md"} or p.name == "Dockerfile")
]
DASHBOARDS = sorted((REPO_ROOT / "deploy" / "grafana").rglob("*.json"))
RULES = sorted((REPO_ROOT / "deploy" / "prometheus").glob("*.yml"))


def rel(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


@functools.lru_cache(maxsize=None)
def text(path: Path) -> str:
    return path.read_text("utf-8")
