"""The metrics README.md, the Grafana dashboard and the Prometheus rules query, and the labels
they use, against a live in-process app's registry (the random cr 0.25 model, loaded in about
0.5 s): a dashboard panel querying a metric nobody exports shows nothing."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from tests.conftest import REPO_ROOT
from tests.docs.docs_helpers import DASHBOARDS, DOCS, RULES, rel, text


# ---- 2. metrics: what README, the dashboard and the alert rules name is exported


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
