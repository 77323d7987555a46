"""The layering, checked on every module's imports (ast, including imports inside functions):

    app.service  ->  app.inference, app.codecs  ->  models  ->  kernels
    app.cli      ->  app.inference, app.codecs (and starts the service only via app.service.server)
    train, bench ->  app.inference, app.codecs, models, kernels (never app.service or app.cli)
    app.client   ->  nothing of ours;  kernels -> nothing of ours above it
    deploy       ->  bench and below (its GPU check);  tests -> anything; nothing -> tests
and no import cycle anywhere. Imports by name (importlib.import_module("..."), __import__) count
too. A new import that breaks a rule, or a module in no layer, fails here, naming it."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO_ROOT

PACKAGES = ("app", "models", "kernels", "train", "bench", "synth", "deploy", "tests")

# layer -> layers it may import (its own layer always allowed)
ALLOWED: dict[str, set[str]] = {
    # app/threads.py, app/heap.py, app/argtypes.py, app/stop_signals.py: process set-up (thread
    # counts, glibc's heap, command-line argument types, early stop signals), nothing of ours
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
    "deploy": {"bench", "inference", "codecs", "models", "kernels", "client", "runtime"},
}
ALLOWED["tests"] = set(ALLOWED)  # the suite imports whatever it checks; nothing imports it
APP_LAYERS = {
    "service": "service",
    "inference": "inference",
    "codecs": "codecs",
    "client": "client",
    "cli": "cli",
    "threads": "runtime",
    "heap": "runtime",
    "argtypes": "runtime",
    "stop_signals": "runtime",
}
SERVER_ENTRY = "app.service.server"


def layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "app":
        return parts[0]
    if len(parts) == 1 or parts[1] == "__main__":
        return "app"
    return APP_LAYERS.get(parts[1], f"no layer (add app.{parts[1]} to APP_LAYERS)")


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            rel = path.relative_to(REPO_ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out[".".join(parts)] = path
    return out


def _imports_by_name(node: ast.AST) -> bool:
    """importlib.import_module("x.y") or __import__("x.y"), the name a constant."""
    if not isinstance(node, ast.Call) or not node.args:
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    arg = node.args[0]
    return (
        name in ("import_module", "__import__")
        and isinstance(arg, ast.Constant)
        and isinstance(arg.value, str)
    )


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
        elif _imports_by_name(node):
            names = [node.args[0].value]
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
            if a != b and b not in ALLOWED.get(a, ()) and not (a == "cli" and dst == SERVER_ENTRY):
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


def test_every_module_is_in_a_layer():
    lost = sorted(f"{m}: {layer(m)}" for m in modules() if layer(m) not in ALLOWED)
    assert not lost, "modules in no layer:\n  " + "\n  ".join(lost)


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
        "bench.y": {"tests.app.service_helpers"},
    }
    assert broken_rules(edges) == [
        "app.cli (cli) imports app.service.main (service)",
        "bench.x (bench) imports app.service.main (service)",
        "bench.y (bench) imports tests.app.service_helpers (tests)",
        "kernels.kmap (kernels) imports models.layers (models)",
        "train.t (train) imports app.cli (cli)",
    ]
    code = "import importlib\nimportlib.import_module('app.service.main')\n__import__('models')"
    probe = ast.parse(code)
    assert [n.args[0].value for n in ast.walk(probe) if _imports_by_name(n)] == [
        "app.service.main",
        "models",
    ]
    assert layer("app.newmodule").startswith("no layer")
    assert cycles(edges) == [["kernels.kmap", "models.layers"]]
    assert "app.cli" in graph() and "app.service.main" in graph()["app.service.server"]
