"""The Prometheus alert rules (deploy/prometheus/lidarseg-alerts.yml, written by generate.py),
on the same queries as the dashboard's panels (queries.py), fleet-wide."""

from __future__ import annotations

from queries import quantile, ratio, slower_than

P99_BUDGET_S = 2.0  # end-to-end p99 over this for 10 min fires LidarsegP99OverBudget
ERROR_RATIO_MAX = 0.05  # 5xx share of segment requests over this for 5 min fires LidarsegErrors
GAVE_UP_RATIO_MAX = 0.05  # 499 + 504 share over this for 5 min fires LidarsegClientsGivingUp
# The sensor's period (10 Hz: 0.1 s, one of the segment histogram's bucket bounds): more than
# SLOW_SHARE_MAX of the segment requests slower than this for 10 min fires LidarsegSlowerThanSensor
FRAME_PERIOD_S = 0.1
SLOW_SHARE_MAX = 0.05
SCRAPE_JOB = "lidarseg"  # deploy/prometheus/prometheus.yml's job (set yours under Kubernetes)


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
                "summary": f"over {ERROR_RATIO_MAX:.0%} of lidarseg segment requests fail with 5xx",
                "description": "5xx ratio {{ $value | humanizePercentage }}",
            },
        },
        {  # a robot's client times out (499) or the deadline passes (504): answers nobody gets
            "alert": "LidarsegClientsGivingUp",
            "expr": f"{ratio('499|504', '5m')} > {GAVE_UP_RATIO_MAX}",
            "for": "5m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"over {GAVE_UP_RATIO_MAX:.0%} of lidarseg segment requests end "
                "with the client gone (499) or past the deadline (504)",
                "description": "share {{ $value | humanizePercentage }}; "
                "lidarseg_wasted_runs_total counts the frames run for nobody",
            },
        },
        {
            "alert": "LidarsegSlowerThanSensor",
            "expr": f"{slower_than(FRAME_PERIOD_S, '10m')} > {SLOW_SHARE_MAX}",
            "for": "10m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"over {SLOW_SHARE_MAX:.0%} of lidarseg segment requests take "
                f"longer than the sensor's period ({FRAME_PERIOD_S} s)",
                "description": "share {{ $value | humanizePercentage }}",
            },
        },
        {
            "alert": "LidarsegNotReady",
            "expr": f'lidarseg_ready == 0 or up{{job="{SCRAPE_JOB}"}} == 0',
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
