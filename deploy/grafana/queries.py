"""The PromQL the dashboard's panels and the alert rules share (deploy/grafana/generate.py
writes both): metric names, the segment route's matcher, the dashboard's instance matcher, and
the quantile, mean, ratio and share-slower-than queries."""

from __future__ import annotations

RI = "$__rate_interval"
STAGE = "lidarseg_stage_duration_seconds"
SEGMENT = "lidarseg_segment_duration_seconds"  # every outcome, by status
REQ = "lidarseg_requests_total"
ON_SEGMENT = 'route="/v1/segment"'  # dashboard polls and probes of /v1/model are not frames
# The dashboard's instance variable (every replica by default, or the ones picked): every panel
# query carries it; the alerts take the whole fleet (a rule has no variables).
INST = 'instance=~"$instance"'


def quantile(q: float, by: str, match: str, window: str = RI, metric: str = STAGE) -> str:
    return f"histogram_quantile({q}, sum by ({by}) (rate({metric}_bucket{{{match}}}[{window}])))"


def mean(metric: str, by: str = "", match: str = "") -> str:
    group = f" by ({by})" if by else ""
    sel = f"{{{match}}}" if match else ""
    return (
        f"sum{group} (rate({metric}_sum{sel}[{RI}])) / sum{group} (rate({metric}_count{sel}[{RI}]))"
    )


def ratio(status: str, window: str = RI, scope: str = "") -> str:
    """The share of segment requests answered with a status matching `status` (`scope`: more
    matchers, such as INST)."""
    on = f"{ON_SEGMENT},{scope}" if scope else ON_SEGMENT
    return (
        f'(sum(rate({REQ}{{{on},status=~"{status}"}}[{window}])) or vector(0)) / '
        f"sum(rate({REQ}{{{on}}}[{window}]))"
    )


def slower_than(seconds: float, window: str) -> str:
    """The share of segment requests (every outcome) that took longer than `seconds`."""
    return (
        f'1 - sum(rate({SEGMENT}_bucket{{le="{seconds}"}}[{window}])) / '
        f"sum(rate({SEGMENT}_count[{window}]))"
    )
