"""The layering, checked on every module's imports (ast, including imports inside functions):

    app.service  ->  app.inference, app.codecs  ->  models  ->  kernels
    app.cli      ->  app.inference, app.codecs (and starts the service only via app.service.server)
    train, bench ->  app.inference, app.codecs, models, kernels (never app.service or app.cli)
    app.client   ->  nothing of ours;  kernels -> nothing of ours above it
and no import cycle anywhere. A new import that breaks a rule fails here, naming it."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO_ROOT

PACKAGES = ("app", "models", "kernels", "train", "bench", "synth")

# layer -> layers it may import (its own layer always allowed)
ALLOWED: dict[str, set[str]] = {
    # app/threads.py, app/heap.py, app/argtypes.py: process set-up (thread counts, glibc's heap,
    # command-line argument types), nothing of ours
    "runtime": set(),
    "kernels": set(),
    "models": {"kernels"},
    "codecs": set(),
    "inference": {"models", "kernels"},
    "service": {"inference", "codecs", "models", "kernels", "runtime"},
    "client": set(),
    "cli": {"inference", "codecs", "models", "kernels", "client", "runtime"},  # + SERVER_ENTRY
    "app": {"cli", "runtime"},  # app/__main__.py sets up the process, then runs the command line
    "synth": {"models", "runtime"},
    "train": {"inference", "codecs", "models", "kernels", "synth", "runtime"},
    "bench": {"inference", "codecs", "models", "kernels", "client", "runtime"},
}
SERVER_ENTRY = "app.service.server"


def layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "app":
        return parts[0]
    if len(parts) == 1 or parts[1] == "__main__":
        return "app"
    return {
        "service": "service",
        "inference": "inference",
        "codecs": "codecs",
        "client": "client",
        "cli": "cli",
        "threads": "runtime",
        "heap": "runtime",
        "argtypes": "runtime",
    }[parts[1]]


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            rel = path.relative_to(REPO_ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out[".".join(parts)] = path
    return out


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Our modules that `module` imports (the most specific one for `from X import name`)."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        found.update(n for n in names if n.split(".")[0] in PACKAGES)
    found.discard(module)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: {i for i in imports(m, p, known) if i in known} for m, p in known.items()}


def broken_rules(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in sorted(edges.items()):
        for dst in sorted(targets):
            a, b = layer(src), layer(dst)
            if a != b and b not in ALLOWED[a] and not (a == "cli" and dst == SERVER_ENTRY):
                bad.append(f"{src} ({a}) imports {dst} ({b})")
    return bad


# Deliberate exceptions, each with its reason (keep this short): none today.
EXCEPTIONS: dict[str, set[str]] = {}


def test_imports_only_go_down():
    edges = {m: targets - EXCEPTIONS.get(m, set()) for m, targets in graph().items()}
    bad = broken_rules(edges)
    assert not bad, "layering broken:\n  " + "\n  ".join(bad)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_checker_sees_a_broken_rule_and_a_cycle():
    edges = {
        "kernels.kmap": {"models.layers"},
        "models.layers": {"kernels.kmap"},
        "bench.x": {"app.service.main"},
        "app.cli": {"app.service.main", SERVER_ENTRY},
        "train.t": {"app.cli"},
    }
    assert broken_rules(edges) == [
        "app.cli (cli) imports app.service.main (service)",
        "bench.x (bench) imports app.service.main (service)",
        "kernels.kmap (kernels) imports models.layers (models)",
        "train.t (train) imports app.cli (cli)",
    ]
    assert cycles(edges) == [["kernels.kmap", "models.layers"]]
    assert "app.cli" in graph() and "app.service.main" in graph()["app.service.server"]


def test_counts_on_the_command_lines_refuse_what_makes_no_sense():
    """app/argtypes.py: a count below its floor is argparse's one line, not a traceback deep in
    (train --steps -3 failed in OneCycleLR, --ckpt-every 0 divided by zero) or a silent clamp
    (synth --count -3 wrote nothing, exit 0)."""
    import argparse

    import pytest

    from app.argtypes import non_negative_int, positive_int

    assert positive_int("3") == 3 and non_negative_int("0") == 0
    for bad in ("0", "-3", "x", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_int(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        non_negative_int("-1")
