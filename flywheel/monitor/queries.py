"""The PromQL the health monitor asks, and how its answers become policy records.

Label names follow the sources: the trainer's `job`/`namespace`/`replica`/`rank` (scraped with honor_labels so the
scrape job does not rename them), and dcgm-exporter's as Prometheus stores them -- the GPU's user in
`exported_pod`/`exported_namespace` when the exporter's own pod labels took `pod`/`namespace`, else in
`pod`/`namespace`; the node in `Hostname` (dcgm-exporter) or `hostname`/`node` (relabelled setups).
"""

from __future__ import annotations

import logging

from flywheel.monitor.prometheus import Sample, finite
from flywheel.policy.health_checks import RankProgress, RankStepTime
from flywheel.policy.xid import XidSample

log = logging.getLogger(__name__)

RANK_LABELS = "namespace, job, replica, rank"


def progress_query(lookback_seconds: int) -> str:
    # last_over_time keeps a rank whose target stopped answering (a SIGSTOPped or wedged process): its series went
    # stale at the failed scrape, but its last step time is exactly what the hang check needs.
    return (f"max by ({RANK_LABELS}) "
            f"(last_over_time(flywheel_train_last_step_timestamp_seconds[{lookback_seconds}s]))")


def step_time_query(window_seconds: int) -> str:
    return (f"sum by ({RANK_LABELS}) (rate(flywheel_train_step_seconds_sum[{window_seconds}s]))"
            f" / sum by ({RANK_LABELS}) (rate(flywheel_train_step_seconds_count[{window_seconds}s]))")


XID_QUERY = "DCGM_FI_DEV_XID_ERRORS"


def parse_progress(samples: list[Sample]) -> list[RankProgress]:
    out = []
    for s in finite(samples):
        lb = s.labels
        if {"namespace", "job", "replica", "rank"} <= lb.keys():
            out.append(RankProgress(lb["namespace"], lb["job"], lb["replica"], lb["rank"], s.value))
    return out


def parse_step_times(samples: list[Sample]) -> list[RankStepTime]:
    out = []
    for s in finite(samples):
        lb = s.labels
        if {"namespace", "job", "replica", "rank"} <= lb.keys():
            out.append(RankStepTime(lb["namespace"], lb["job"], lb["replica"], lb["rank"], s.value))
    return out


def _xid_code(s: Sample) -> int | None:
    # err_code names the XID in current exporters; older ones carry it only as the value.
    raw = s.labels.get("err_code", "")
    try:
        return int(raw) if raw else int(s.value)
    except ValueError:
        return None


def parse_xids(samples: list[Sample]) -> list[XidSample]:
    out = []
    for s in finite(samples):
        lb = s.labels
        node = lb.get("Hostname") or lb.get("hostname") or lb.get("node")
        code = _xid_code(s)
        if not node or code is None:
            log.warning("XID series without a node or code ignored: %s", lb)
            continue
        pod = lb.get("exported_pod") or lb.get("pod") or None
        namespace = lb.get("exported_namespace") or lb.get("namespace") or None
        gpu = lb.get("UUID") or lb.get("gpu") or ""
        out.append(XidSample(node, gpu, code, pod, namespace))
    return out
