"""Builds the Grafana dashboard and the Prometheus alert rules from one list of queries.

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
from grafana_foundation_sdk.models.dashboard import DataSourceRef, Threshold, ThresholdsMode

HERE = Path(__file__).resolve().parent
DASHBOARD = HERE / "provisioning" / "dashboards" / "lidarseg.json"
ALERTS = HERE.parent / "prometheus" / "lidarseg-alerts.yml"
PROM = DataSourceRef(type_val="prometheus", uid="prometheus")
RI = "$__rate_interval"

P99_BUDGET_S = 2.0  # end-to-end p99 over this for 10 min fires LidarsegP99OverBudget
ERROR_RATIO_MAX = 0.05  # 5xx share of /v1 requests over this for 5 min fires LidarsegErrors

STAGE = "lidarseg_stage_duration_seconds"
REQ = "lidarseg_requests_total"


def quantile(q: float, by: str, match: str, window: str = RI) -> str:
    return f"histogram_quantile({q}, sum by ({by}) (rate({STAGE}_bucket{{{match}}}[{window}])))"


def mean(metric: str, by: str = "", match: str = "") -> str:
    group = f" by ({by})" if by else ""
    sel = f"{{{match}}}" if match else ""
    return (
        f"sum{group} (rate({metric}_sum{sel}[{RI}])) / sum{group} (rate({metric}_count{sel}[{RI}]))"
    )


def ratio(status: str, window: str = RI) -> str:
    return (
        f'(sum(rate({REQ}{{status=~"{status}"}}[{window}])) or vector(0)) / '
        f"sum(rate({REQ}[{window}]))"
    )


# (title, unit, [(expr, legend)], exemplars, stacked, kind, width)
PANELS = [
    (
        "Requests per second by status",
        "reqps",
        [(f"sum by (status) (rate({REQ}[{RI}]))", "{{status}}")],
        False,
        False,
        "ts",
        8,
    ),
    (
        "End-to-end latency p50 / p95 / p99",
        "s",
        [(quantile(q, "le", 'stage="total"'), f"p{round(q * 100)}") for q in (0.5, 0.95, 0.99)],
        True,
        False,
        "ts",
        8,
    ),
    (
        "Error ratio (4xx, 5xx)",
        "percentunit",
        [(ratio("4.."), "4xx"), (ratio("5.."), "5xx")],
        False,
        False,
        "ts",
        8,
    ),
    *[
        (
            f"Stage latency p{round(q * 100)}",
            "s",
            [(quantile(q, "le, stage", 'stage!="total"'), "{{stage}}")],
            True,
            False,
            "ts",
            8,
        )
        for q in (0.5, 0.95, 0.99)
    ],
    (
        "Stage breakdown (mean time per request, stacked)",
        "s",
        [(mean(STAGE, "stage", 'stage!="total"'), "{{stage}}")],
        False,
        True,
        "ts",
        12,
    ),
    (
        "Queue depth and requests in flight",
        "short",
        [
            ("sum(lidarseg_queue_depth)", "queued"),
            ("sum(lidarseg_requests_in_flight)", "in flight"),
            (f"sum(rate(lidarseg_deadline_dropped_total[{RI}]))", "dropped at deadline /s"),
        ],
        False,
        False,
        "ts",
        12,
    ),
    (
        "Batch size (frames per pipeline run)",
        "short",
        [
            (mean("lidarseg_batch_size"), "mean"),
            (
                f"histogram_quantile(0.95, sum by (le) (rate(lidarseg_batch_size_bucket[{RI}])))",
                "p95",
            ),
        ],
        False,
        False,
        "ts",
        8,
    ),
    (
        "Points and voxels per request (mean)",
        "short",
        [
            (mean("lidarseg_points_per_request"), "points"),
            (mean("lidarseg_voxels_per_request"), "voxels"),
            (
                f"sum(rate(lidarseg_cleaned_points_total[{RI}])) / "
                f"sum(rate(lidarseg_points_per_request_count[{RI}]))",
                "cleaned points (intensity clamped)",
            ),
        ],
        False,
        False,
        "ts",
        8,
    ),
    ("Ready", "none", [("min(lidarseg_ready)", "ready")], False, False, "stat", 8),
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
    for pid, spec in enumerate(PANELS, 1):
        d = d.with_panel(panel(pid, *spec))
    return json.loads(JSONEncoder(sort_keys=True, indent=2).encode(d.build()))


def build_alerts() -> dict:
    p99 = quantile(0.99, "le", 'stage="total"', "5m")
    rules = [
        {
            "alert": "LidarsegP99OverBudget",
            "expr": f"{p99} > {P99_BUDGET_S}",
            "for": "10m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"lidarseg end-to-end p99 over {P99_BUDGET_S} s",
                "description": "p99 is {{ $value | humanizeDuration }}; see the "
                "stage panels and the exemplars' traces",
            },
        },
        {
            "alert": "LidarsegErrors",
            "expr": f"{ratio('5..', '5m')} > {ERROR_RATIO_MAX}",
            "for": "5m",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": f"over {ERROR_RATIO_MAX:.0%} of lidarseg requests fail with 5xx",
                "description": "5xx ratio {{ $value | humanizePercentage }}",
            },
        },
        {
            "alert": "LidarsegNotReady",
            "expr": 'lidarseg_ready == 0 or up{job="lidarseg"} == 0',
            "for": "5m",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "lidarseg {{ $labels.instance }} is not ready (model not "
                "loaded, draining, or not scraped)"
            },
        },
        {  # an image or host missing a library Open3D loads (libEGL, libGL): the same labels
            "alert": "LidarsegVoxelizerFallback",
            "expr": 'lidarseg_model_info{voxelizer!="open3d"} == 1',
            "for": "1m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "lidarseg {{ $labels.instance }} voxelizes with "
                "{{ $labels.voxelizer }}, not Open3D (75x slower on a CPU)",
                "description": "Open3D did not load; the server's start-up log says why "
                "(on Debian: libegl1 libgl1)",
            },
        },
    ]
    return {"groups": [{"name": "lidarseg", "rules": rules}]}


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
