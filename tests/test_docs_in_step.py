"""The user-facing documentation against the code it describes, one fact at a time: the settings
README.md, docs/ and deploy/ name (and the defaults and ranges README states), the metrics README,
the Grafana dashboard and the Prometheus rules query (and the labels they use), the command
lines README and docs/ show, and the HTTP paths README names. Each fact has its home in the code
(config.py, metrics.py, the modules' argparse parsers, the app's routes); these tests fail when a
document says otherwise.

The metrics and routes come from a live in-process app (the random cr 0.25 model, loaded in
about 0.5 s): a dashboard panel querying a metric nobody exports shows nothing.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import re
from pathlib import Path
from unittest import mock

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from starlette.routing import Match, Mount

from app.service.config import OTHER_VARIABLES, PREFIX, Settings
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
FIELDS = {f"{PREFIX}{name.upper()}": name for name in Settings.model_fields}
VARIABLE = re.compile(r"LIDARSEG_[A-Z0-9_]*[A-Z0-9]")


def rel(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


@functools.lru_cache(maxsize=None)
def text(path: Path) -> str:
    return path.read_text("utf-8")


# ---- 1. settings: every LIDARSEG_* variable a document names, and the defaults README states


def named_variables() -> list[tuple[str, str]]:
    files = [*DOCS, REPO_ROOT / "Dockerfile", *DEPLOY]
    return sorted({(name, rel(p)) for p in files for name in VARIABLE.findall(text(p))})


@pytest.mark.parametrize("name, where", named_variables())
def test_every_variable_a_document_names_is_read(name, where):
    """A setting (config.py's Settings) or one of the variables read outside it (OTHER_VARIABLES);
    anything else is set or documented for nothing (the server only warns about it)."""
    assert name in FIELDS or name in OTHER_VARIABLES, f"{where} names {name}: nothing reads it"


@functools.lru_cache(maxsize=None)
def readers() -> tuple[str, ...]:
    """The code, scripts and manifests (config.py, which lists the names, aside)."""
    roots = ("app", "kernels", "models", "bench", "train", "synth", "deploy", ".ci")
    return tuple(
        p.read_text("utf-8", "ignore")
        for root in roots
        for p in sorted((REPO_ROOT / root).rglob("*"))
        if p.is_file() and p.suffix in {".py", ".sh", ".yaml", ".yml", ""} and p.name != "config.py"
    )


@pytest.mark.parametrize("name", sorted(OTHER_VARIABLES))
def test_every_variable_read_outside_the_settings_is_read_and_documented(name):
    """OTHER_VARIABLES lists what the code, its scripts and manifests read (os.environ, a shell's
    or compose's ${...}): a name nothing reads any more must leave the list; README names each."""
    read = re.compile(rf"(environ(\.get)?\(|environ\[|getenv\()\s*[\"']{name}[\"']|\$\{{?{name}\b")
    assert any(read.search(source) for source in readers()), f"nothing reads {name}"
    assert name in text(README), f"README.md does not name {name}"


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_every_setting_is_documented(name):
    assert re.search(rf"\b{name}(?![A-Z0-9_])", text(README)), f"README.md lacks {name}"


# `LIDARSEG_X` [default, ...] or `LIDARSEG_X` (default; ...): README's form for a setting's default
STATED = re.compile(r"`(LIDARSEG_[A-Z0-9_]+)`\s*([\[(])")
UNITS = {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def bracket(source: str, start: int, opening: str) -> str:
    """The text inside the bracket opening at `start`, up to its partner (nesting counted)."""
    closing, depth = {"[": "]", "(": ")"}[opening], 0
    for i in range(start, len(source)):
        depth += {opening: 1, closing: -1}.get(source[i], 0)
        if depth == 0:
            return " ".join(source[start + 1 : i].split())
    raise AssertionError(f"unclosed {opening} at {start}")


def stated_defaults() -> list[tuple[str, str, str]]:
    found = []
    for doc in DOCS:
        for m in STATED.finditer(text(doc)):
            if m.group(1) in FIELDS:
                found.append((m.group(1), bracket(text(doc), m.end() - 1, m.group(2)), rel(doc)))
    return found


def stated_value(said: str):
    """The value a default statement starts with: a number (2,000,000; 64 MiB), a word."""
    m = re.match(r"(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?![\w.])(?:\s*(KiB|MiB|GiB)\b)?", said)
    if m:
        return float(m.group(1).replace(",", "")) * UNITS.get(m.group(2) or "", 1)
    m = re.match(r"[^\s,;:]+", said)
    assert m, said
    return m.group(0)


def bounds(name: str) -> tuple[float | None, float | None]:
    low = high = None
    for rule in Settings.model_fields[name].metadata:
        low = getattr(rule, "ge", getattr(rule, "gt", low))
        high = getattr(rule, "le", getattr(rule, "lt", high))
    return low, high


@pytest.mark.parametrize("name, said, where", stated_defaults())
def test_stated_defaults_and_ranges_are_the_settings(name, said, where):
    """`LIDARSEG_SHUTDOWN_BUDGET_S` [25, ...; 6 to 300]: the first value is the field's default
    (a word: a choice or true/false; 'none': no value), 'A to B' its bounds."""
    field = FIELDS[name]
    default = Settings.model_fields[field].default
    value = stated_value(said)
    if isinstance(value, float):
        assert not isinstance(default, (bool, str)), (name, said, default)
        assert value == default, f"{where}: {name} [{said}], the default is {default}"
    elif isinstance(default, bool):
        assert value == str(default).lower(), f"{where}: {name} ({said}), the default is {default}"
    elif value == "none":
        assert default in ((), "", None), f"{where}: {name} ({said}), the default is {default!r}"
    else:
        assert value == default, f"{where}: {name} ({said}), the default is {default!r}"
    for clause in re.split(r"[;,] ", said):  # a clause of its own: "6 to 300"
        m = re.fullmatch(r"(\d[\d,.]*) to (\d[\d,.]*)", clause.strip())
        if not m:
            continue
        stated = (float(m[1].replace(",", "")), float(m[2].replace(",", "")))
        assert stated == bounds(field), f"{where}: {name} [{said}], the bounds are {bounds(field)}"


def assigned_values() -> list[tuple[str, str, str]]:
    """LIDARSEG_<SETTING> values the images and manifests set (ENV, compose, Kubernetes) and the
    docs' examples (`LIDARSEG_ACCESS_LOG=auto|json|text|off`: each alternative)."""
    found = set()
    for path in [REPO_ROOT / "Dockerfile", *DEPLOY, *DOCS]:
        for line in text(path).splitlines():
            line = line if path in DOCS else line.split("#", 1)[0]
            for m in re.finditer(
                r"\b(LIDARSEG_[A-Z0-9_]+)(?:=|:\s+|, value:\s*)\"?([\w.|]+)(?!\w|://)", line
            ):
                if m.group(1) in FIELDS:
                    found |= {(m[1], v, rel(path)) for v in m[2].split("|") if v}
    return sorted(found)


@pytest.mark.parametrize("name, value, where", assigned_values())
def test_assigned_values_are_valid_settings(name, value, where):
    """What a manifest sets or a document shows must pass the field's type and bounds."""
    from pydantic import TypeAdapter, ValidationError

    field = Settings.model_fields[FIELDS[name]]
    try:
        TypeAdapter(field.rebuild_annotation()).validate_python(value)
    except ValidationError as e:
        raise AssertionError(f"{where}: {name}={value}: {e}") from None


# ---- 2. metrics: what README, the dashboard and the alert rules name is exported


@pytest.fixture(scope="module")
def live():
    """A ready in-process app (model loaded: lidarseg_model_info has its labels)."""
    from tests.app.contract_helpers import serving

    with serving() as client:
        yield client.app


@pytest.fixture(scope="module")
def exported(live) -> dict[str, set[str]]:
    """Every series name /metrics can hold, with its label names (what PromQL can select)."""
    metrics = live.state.service.metrics
    declared = {
        m._name: set(m._labelnames)
        for m in vars(metrics).values()
        if isinstance(m, MetricWrapperBase)
    }
    suffixes = {
        "counter": ("_total", "_created"),
        "gauge": ("",),
        "info": ("_info",),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("", "_count", "_sum", "_created"),
    }
    names: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        labels = declared.get(family.name, set())
        for suffix in suffixes.get(family.type, ("",)):
            names[family.name + suffix] = set(labels) | ({"le"} if suffix == "_bucket" else set())
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    assert "lidarseg_requests_total" in names and "voxelizer" in names["lidarseg_model_info"]
    return names


@pytest.fixture(scope="module")
def documentable(exported, live) -> dict[str, set[str]]:
    """The series, and a histogram's family name with its labels (README's
    `lidarseg_stage_duration_seconds{stage}`: no series has that name, but it names them all)."""
    names = dict(exported)
    for family in live.state.service.metrics.registry.collect():
        if family.type in {"histogram", "summary"}:
            names[family.name] = exported[family.name + "_count"]
    return names


TARGET_LABELS = {"instance", "job"}  # Prometheus adds them to every scraped series
METRIC = re.compile(r"(?<![\w/.-])((?:lidarseg|process|python)_[a-z0-9_]*[a-z0-9])(\{[^}]*\})?")


def documented_metrics() -> list[tuple[str, str, str]]:
    """Metric names and their `{labels}` in README, docs/ and the deploy files' prose."""
    prose = [*DOCS, *sorted((REPO_ROOT / "deploy" / "k8s").rglob("*.yaml"))]
    found = set()
    for path in prose:
        for m in METRIC.finditer(text(path)):
            found.add((m.group(1), m.group(2) or "", rel(path)))
    return sorted(found)


def label_names(braces: str) -> set[str]:
    """`{route, status}` or `{reason="superseded"}`: the label names; `...` skipped."""
    inside = re.sub(r'"(?:[^"\\]|\\.)*"', "", braces.strip("{}"))
    return set(re.findall(r"(?<![\w.])([a-zA-Z_]\w*)(?=\s*(?:[=!]|,|$))", inside))


@pytest.mark.parametrize("name, labels, where", documented_metrics())
def test_documented_metrics_are_exported(documentable, name, labels, where):
    assert name in documentable, f"{where} names {name}, which /metrics does not export"
    unknown = label_names(labels) - documentable[name]
    assert not unknown, f"{where}: {name} has no label {unknown}"


# PromQL, read just far enough to know its metric names and the label names it uses
TOKEN = re.compile(
    r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|\[[^\]]*\]|\{[^}]*\}|\d+(?:\.\d+)?(?:e[+-]?\d+)?'
    r"|[A-Za-z_:][\w:]*|\S"
)
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = GROUPING | {"bool", "offset", "and", "or", "unless", "inf", "nan"}


def closing(tokens: list[str], start: int) -> int:
    """The index of the ')' that closes the '(' at `start`."""
    depth = 0
    for end in range(start, len(tokens)):
        depth += {"(": 1, ")": -1}.get(tokens[end], 0)
        if depth == 0:
            return end
    raise AssertionError(f"unbalanced: {' '.join(tokens)}")


def promql_problems(expr: str, exported: dict[str, set[str]]) -> list[str]:
    """Metrics not exported, matchers and groupings on labels their metrics do not have."""
    tokens = [t.group(0) for t in TOKEN.finditer(expr)]
    groupings, label_slots = [], set()  # (keyword index, labels, the tokens they apply to)
    for i, tok in enumerate(tokens):
        if tok in GROUPING and tokens[i + 1 : i + 2] == ["("]:
            end = closing(tokens, i + 1)
            label_slots |= set(range(i + 1, end))
            # sum by (x) (arg): arg's metrics must carry x; sum (arg) by (x), on (x): the whole
            following = tokens[end + 1 : end + 2] == ["("] and tok in {"by", "without"}
            scope = range(end + 1, closing(tokens, end + 1)) if following else range(len(tokens))
            groupings.append((tok, [t for t in tokens[i + 2 : end] if t != ","], scope))
    problems, metrics_at = [], {}
    for i, tok in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        # not a name, a label of a grouping, a function, an aggregation (sum by (...) (...))
        if not re.fullmatch(r"[A-Za-z_:][\w:]*", tok) or i in label_slots or tok in KEYWORDS:
            continue
        if nxt in {"(", "by", "without"}:
            continue
        if tok == "up":  # Prometheus's own, per target
            metrics_at[i] = TARGET_LABELS
            continue
        if tok not in exported:
            problems.append(f"{tok} is not exported")
            continue
        metrics_at[i] = exported[tok] | TARGET_LABELS
        if nxt.startswith("{"):
            for label in label_names(nxt) - metrics_at[i]:
                problems.append(f"{tok} has no label {label!r}")
    for keyword, labels, scope in groupings:
        for k in scope:
            for label in set(labels) - metrics_at.get(k, set(labels)):
                problems.append(f"{tokens[k]} has no label {label!r} ({keyword} ...)")
    return problems


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(where, expr, legend) of every panel target and template variable query."""
    found = []
    for path in DASHBOARDS:
        dashboard = json.loads(text(path))
        for panel in dashboard.get("panels", []):
            for target in panel.get("targets", []):
                where = f"{rel(path)}: {panel['title']}"
                found.append((where, target["expr"], target.get("legendFormat", "")))
        for variable in dashboard.get("templating", {}).get("list", []):
            query = variable.get("query", "")
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
            if m:  # label_values(metric, label): the metric must carry the label
                found.append((f"{rel(path)}: ${variable['name']}", m.group(1), "{{%s}}" % m[2]))
    return found


@pytest.mark.parametrize("where, expr, legend", dashboard_queries())
def test_dashboard_queries_name_exported_metrics_and_labels(exported, where, expr, legend):
    problems = promql_problems(expr, exported)
    assert not problems, f"{where}: {problems} in {expr}"
    tokens = [t.group(0) for t in TOKEN.finditer(expr)]
    series = [exported[t] | TARGET_LABELS for t in tokens if t in exported]
    for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", legend):  # {{stage}}: on every series
        assert all(label in labels for labels in series), (where, legend, expr)


def alert_rules() -> list[tuple[str, dict]]:
    found = []
    for path in RULES:
        for group in (yaml.safe_load(text(path)) or {}).get("groups", []):
            found += [
                (f"{rel(path)}: {r.get('alert') or r.get('record')}", r) for r in group["rules"]
            ]
    return found


@pytest.mark.parametrize("where, rule", alert_rules())
def test_alert_rules_name_exported_metrics_and_labels(exported, where, rule):
    expr = rule["expr"]
    problems = promql_problems(expr, exported)
    assert not problems, f"{where}: {problems} in {expr}"
    tokens = [t.group(0) for t in TOKEN.finditer(expr)]
    series = [exported[t] | TARGET_LABELS for t in tokens if t in exported]
    for note in rule.get("annotations", {}).values():
        for label in re.findall(r"\$labels\.(\w+)", note):  # on some series of the expression
            assert any(label in labels for labels in series), (where, note)


def rule_test_series() -> list[tuple[str, str]]:
    """The input series of promtool's rule tests: made-up series of a metric or label nobody
    exports would test the rules against nothing that can happen."""
    found = []
    for path in RULES:
        for case in (yaml.safe_load(text(path)) or {}).get("tests", []):
            found += [(rel(path), s["series"]) for s in case.get("input_series", [])]
            found += [(rel(path), t["expr"]) for t in case.get("promql_expr_test", [])]
    return found


@pytest.mark.parametrize("where, series", rule_test_series())
def test_rule_tests_feed_series_that_exist(exported, where, series):
    problems = promql_problems(series, exported)
    assert not problems, f"{where}: {problems} in {series}"


# ---- 3. command lines: the module exists and its parser takes the options shown

COMMAND = re.compile(r"python -m ((?:app|bench|train|synth)(?:\.\w+)?)\b")
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*(\.[a-z]+)?|.*\.\.\..*|<.*>")
SHELL_ENDS = {"&&", "||", "|", ";", ">", "2>&1"}


class _Parser(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def _hand_over(self, args=None, namespace=None):
    raise _Parser(self)


@functools.lru_cache(maxsize=None)
def parser_of(module: str) -> argparse.ArgumentParser:
    """The parser `python -m module` builds: its main() is run until it parses (then stopped)."""
    try:
        mod = importlib.import_module("app.cli" if module == "app" else module)
    except ModuleNotFoundError as e:
        raise AssertionError(f"python -m {module}: no such module ({e})") from None
    with mock.patch.object(argparse.ArgumentParser, "parse_args", _hand_over):
        with mock.patch.object(argparse.ArgumentParser, "parse_known_args", _hand_over):
            try:
                mod.main([])
            except _Parser as got:
                return got.parser
    raise AssertionError(f"{module}: main() parsed no arguments")


def shown_commands() -> list[tuple[str, str, str]]:
    """(where, module, the command line after it) for each `python -m` of ours in the docs: to
    the end of the inline code span, or of the line in a code block."""
    found = []
    for doc in DOCS:
        source = text(doc)
        for m in COMMAND.finditer(source):
            line_start = source.rfind("\n", 0, m.start()) + 1
            before = source[line_start : m.start()]
            fenced = source.count("\n```", 0, m.start()) % 2 == 1
            in_block = "`" not in before and (fenced or before.startswith("    "))
            end = source.find("\n" if in_block else "`", m.end())
            assert 0 <= end - m.end() < 400, (
                f"{rel(doc)}: no end to {source[m.start() : m.start() + 80]!r}"
            )
            line = source[: m.start()].count("\n") + 1
            found.append(
                (f"{rel(doc)}:{line}", m.group(1), " ".join(source[m.end() : end].split()))
            )
    return found


def options_problems(module: str, args: str) -> list[str]:
    """The option names, subcommands and choices of `args` that `module`'s parser refuses."""
    code, _, comment = args.partition("#")
    tokens = code.replace("[", " ").replace("]", " ").split()
    tokens += [t for t in comment.replace("[", " ").replace("]", " ").split() if t.startswith("-")]
    parsers, problems, i, slot = [parser_of(module)], [], 0, 0
    command = f"python -m {module}"
    while i < len(tokens):
        tok = tokens[i].rstrip(",;")
        i += 1
        if tok in SHELL_ENDS:
            break
        if tok.startswith("-") and len(tok) > 1:
            name, _, inline = tok.partition("=")
            actions = [p._option_string_actions.get(name) for p in parsers]
            if None in actions:
                problems.append(f"{name}: not an option of {command}")
                continue
            action = actions[0]
            values = [inline] if inline else []
            wants = {None: 1, "?": 1, "+": 99, "*": 99}.get(action.nargs, action.nargs)
            while not inline and wants and i < len(tokens) and not tokens[i].startswith("-"):
                values.append(tokens[i].rstrip(",;"))
                i, wants = i + 1, wants - 1
            for value in values:
                if action.choices is not None and not PLACEHOLDER.fullmatch(value):
                    bad = [v for v in value.split("|") if v not in map(str, action.choices)]
                    problems += [f"{name} {v}: not one of {list(action.choices)}" for v in bad]
            continue
        positionals = [a for a in parsers[0]._actions if not a.option_strings]
        if slot >= len(positionals):
            problems.append(f"{tok}: an argument {command} does not take")
            continue
        action = positionals[slot]
        if action.choices is not None and not PLACEHOLDER.fullmatch(tok):
            names = tok.split("|")
            bad = [n for n in names if n not in action.choices]
            problems += [f"{n}: not one of {list(action.choices)}" for n in bad]
            if isinstance(action, argparse._SubParsersAction) and not bad:
                parsers, slot = [action.choices[n] for n in names], 0
                command += f" {tok}"
                continue
        if action.nargs not in ("+", "*"):
            slot += 1
    return problems


@pytest.mark.parametrize("where, module, args", shown_commands())
def test_shown_command_lines_parse(where, module, args):
    problems = options_problems(module, args)
    assert not problems, f"{where}: python -m {module} {args}: {problems}"


# ---- 4. HTTP paths: each one README names is a route of the app

PATH = re.compile(
    r"(?:\b(GET|POST|HEAD|PUT|DELETE|PATCH) )?`?"
    r"(?:(?<![\w./+~:-])|https?://(?:127\.0\.0\.1|localhost):8000)(/[A-Za-z][\w/{}.*-]*)"
)
FILESYSTEM = {"tmp", "usr", "var", "work", "proc", "opt", "etc", "dev", "sys", "home", "root"}
FILESYSTEM |= {"bin", "lib", "src", "mnt", "run", "srv", "data"}


def named_paths() -> list[tuple[str, str, str]]:
    found = set()
    for doc in DOCS:
        for m in PATH.finditer(text(doc)):
            path = m.group(2).rstrip(".,;:")
            if path.split("/")[1] in FILESYSTEM or "*" in path:
                continue
            found.add((m.group(1) or "", path, rel(doc)))
    return sorted(found)


@pytest.mark.parametrize("method, path, where", named_paths())
def test_named_paths_are_routes(live, method, path, where):
    concrete = re.sub(r"\{\w+\}", "x", path)
    scope = {"type": "http", "path": concrete, "method": method or "GET", "root_path": ""}
    scope |= {"headers": [], "query_string": b""}
    matches = {route.matches(scope)[0] for route in live.routes}
    mounts = {route.path for route in live.routes if isinstance(route, Mount)}
    wanted = {Match.FULL} if method else {Match.FULL, Match.PARTIAL}
    assert matches & wanted or path in mounts, f"{where}: {method} {path} is no route of the app"
