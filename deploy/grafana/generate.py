"""Builds the Grafana dashboard and the Prometheus alert rules (alerts.py) from one set of
queries (queries.py).

    python deploy/grafana/generate.py           # rewrites the two generated files
    python deploy/grafana/generate.py --check   # exits 1 when they are not what this script builds

Writes deploy/grafana/provisioning/dashboards/lidarseg.json (with grafana-foundation-sdk's typed
builders: the JSON is valid by construction, never hand-edited) and
deploy/prometheus/lidarseg-alerts.yml. Latency panels show exemplars; the Prometheus datasource
(provisioning/datasources/lidarseg.yaml) turns an exemplar's `trace_id` into a link to the trace
in Tempo. tests/deploy/test_prometheus.py runs every panel query against a real Prometheus.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    VariableRefresh,
)

from alerts import build_alerts
from queries import INST, ON_SEGMENT, REQ, RI, SEGMENT, STAGE, mean, quantile, ratio

HERE = Path(__file__).resolve().parent
DASHBOARD = HERE / "provisioning" / "dashboards" / "lidarseg.json"
ALERTS = HERE.parent / "prometheus" / "lidarseg-alerts.yml"
PROM = DataSourceRef(type_val="prometheus", uid="prometheus")

QS = (0.5, 0.95, 0.99)
# (title, unit, [(expr, legend)], exemplars, stacked, kind, width)
PANELS = [
    (
        "Segment requests per second by status",
        "reqps",
        [(f"sum by (status) (rate({REQ}{{{ON_SEGMENT},{INST}}}[{RI}]))", "{{status}}")],
        False,
        False,
        "ts",
        8,
    ),
    (
        "End-to-end latency p50 / p95 / p99 (answered), p99 of every outcome",
        "s",
        [(quantile(q, "le", f'stage="total",{INST}'), f"p{round(q * 100)}") for q in QS]
        + [(quantile(0.99, "le", INST, metric=SEGMENT), "p99, 4xx / 499 / 503 / 504 too")],
        True,
        False,
        "ts",
        8,
    ),
    (
        "Segment error ratio (4xx, 5xx; clients giving up: 499, 504)",
        "percentunit",
        [
            (ratio(s, scope=INST), name)
            for s, name in (("4..", "4xx"), ("5..", "5xx"), ("499|504", "499 + 504"))
        ],
        False,
        False,
        "ts",
        8,
    ),
    *[
        (
            f"Stage latency p{round(q * 100)}",
            "s",
            [(quantile(q, "le, stage", f'stage!="total",{INST}'), "{{stage}}")],
            True,
            False,
            "ts",
            8,
        )
        for q in QS
    ],
    (
        "Stage breakdown (mean time per request, stacked)",
        "s",
        [(mean(STAGE, "stage", f'stage!="total",{INST}'), "{{stage}}")],
        False,
        True,
        "ts",
        12,
    ),
    (
        "Queue depth and requests in flight",
        "short",
        [
            (f"sum(lidarseg_queue_depth{{{INST}}})", "queued"),
            (f"sum(lidarseg_requests_in_flight{{{INST}}})", "in flight"),
            (
                f"sum by (reason) (rate(lidarseg_dropped_total{{{INST}}}[{RI}]))",
                "never run ({{reason}}) /s",
            ),
            (
                f"sum by (reason) (rate(lidarseg_wasted_runs_total{{{INST}}}[{RI}]))",
                "run for nobody ({{reason}}) /s",
            ),
        ],
        False,
        False,
        "ts",
        12,
    ),
    (
        "Batch size (frames per pipeline run)",
        "short",
        # (a p95 interpolated 0.95 for batches of 1)
        [(mean("lidarseg_batch_size", match=INST), "mean")],
        False,
        False,
        "ts",
        8,
    ),
    (
        "Points and voxels per request (mean)",
        "short",
        [
            (mean("lidarseg_points_per_request", match=INST), "points"),
            (mean("lidarseg_voxels_per_request", match=INST), "voxels"),
            (
                f"sum(rate(lidarseg_cleaned_points_total{{{INST}}}[{RI}])) / "
                f"sum(rate(lidarseg_points_per_request_count{{{INST}}}[{RI}]))",
                "cleaned points (intensity clamped)",
            ),
        ],
        False,
        False,
        "ts",
        8,
    ),
    (
        "Ready, by instance",
        "none",
        [(f"min by (instance) (lidarseg_ready{{{INST}}})", "{{instance}}")],
        False,
        False,
        "stat",
        8,
    ),
]


def query(expr: str, legend: str, ref: str, exemplar: bool) -> prometheus.Dataquery:
    return (
        prometheus.Dataquery()
        .expr(expr)
        .legend_format(legend)
        .ref_id(ref)
        .exemplar(exemplar)
        .range()
        .datasource(PROM)
    )


def panel(pid, title, unit, queries, exemplars, stacked, kind, width):
    p = timeseries.Panel() if kind == "ts" else stat.Panel()
    p = p.id(pid).title(title).unit(unit).datasource(PROM).span(width).height(8)
    for i, (expr, legend) in enumerate(queries):
        p = p.with_target(query(expr, legend, chr(ord("A") + i), exemplars))
    if kind == "ts":
        p = (
            p.fill_opacity(30 if stacked else 5)
            .line_width(1)
            .legend(
                cb.VizLegendOptions()
                .display_mode(common.LegendDisplayMode.LIST)
                .placement(common.LegendPlacement.BOTTOM)
                .show_legend(True)
            )
        )
        if stacked:
            p = p.stacking(cb.StackingConfig().mode(common.StackingMode.NORMAL))
        if unit == "s":
            p = p.min(0)
    else:
        p = p.reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"])).thresholds(
            db.ThresholdsConfig()
            .mode(ThresholdsMode.ABSOLUTE)
            .steps([Threshold(value=None, color="red"), Threshold(value=1, color="green")])
        )
    return p


def build_dashboard() -> dict:
    d = (
        db.Dashboard("lidarseg")
        .uid("lidarseg")
        .tags(["lidarseg", "generated"])
        .refresh("10s")
        .time("now-30m", "now")
        .timezone("browser")
        .editable()
    )
    d = d.with_variable(
        db.QueryVariable("instance")
        .label("instance")
        .datasource(PROM)
        .query("label_values(lidarseg_ready, instance)")
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
    )
    for pid, spec in enumerate(PANELS, 1):
        d = d.with_panel(panel(pid, *spec))
    return json.loads(JSONEncoder(sort_keys=True, indent=2).encode(d.build()))


def rendered() -> dict[Path, str]:
    header = "# generated by deploy/grafana/generate.py: edit that, not this\n"
    return {
        DASHBOARD: json.dumps(build_dashboard(), indent=2, sort_keys=True) + "\n",
        ALERTS: header + yaml.safe_dump(build_alerts(), sort_keys=False, width=100),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--check", action="store_true", help="compare, write nothing")
    args = ap.parse_args(argv)
    stale = []
    for path, text in rendered().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(
            "out of date (run python deploy/grafana/generate.py): " + ", ".join(map(str, stale)),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
