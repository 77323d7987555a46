"""pytest plugin for the GPU check's whole-suite step (`-p skip_missing`, this folder on the path).

The H200 image has torch, numpy, pytest and hypothesis but not the service's packages (FastAPI,
Open3D, ...). A test folder or file whose import needs a package this machine lacks is left out
and named in the summary with the missing package, instead of failing the run as a collection
error. A missing module of our own (app, models, kernels, ...) is not excused: it still fails.
"""

from __future__ import annotations

import importlib
from pathlib import Path

OURS = {"app", "bench", "deploy", "kernels", "models", "synth", "tests", "train"}
_left_out: list[tuple[str, str]] = []


def _missing(module: str) -> str | None:
    """The missing third-party module that importing `module` runs into, else None."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        top = (e.name or "").split(".")[0]
        if top and top not in OURS:
            return e.name
    except Exception:  # any other import error: let pytest report it as usual
        return None
    return None


def pytest_ignore_collect(collection_path: Path, config):
    path = Path(collection_path)
    try:
        rel = path.relative_to(config.rootpath)
    except ValueError:
        return None
    if path.is_dir():
        target = path / "conftest.py"
        if not target.exists():
            return None
        module = ".".join(rel.parts + ("conftest",))
    elif path.suffix == ".py" and path.name.startswith("test_"):
        module = ".".join(rel.with_suffix("").parts)
    else:
        return None
    missing = _missing(module)
    if missing is None:
        return None
    _left_out.append((str(rel), missing))
    return True


def pytest_terminal_summary(terminalreporter):
    if _left_out:
        terminalreporter.section("left out: packages this machine lacks")
        for rel, missing in _left_out:
            terminalreporter.write_line(f"{rel}: needs {missing}")
