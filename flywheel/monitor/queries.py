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


def _last(metric: str, lookback_seconds: int) -> str:
    return f"max by ({RANK_LABELS}) (last_over_time({metric}[{lookback_seconds}s]))"


def progress_query(lookback_seconds: int) -> str:
    # last_over_time keeps a rank whose target stopped answering (a SIGSTOPped or wedged process): its series went
    # stale at the failed scrape, but its last progress time is exactly what the hang check needs. The progress
    # gauge (a step or an evaluation batch) where the trainer exports it, else the step time (flywheel.progress).
    return (f"{_last('flywheel_train_last_progress_timestamp_seconds', lookback_seconds)} or "
            f"{_last('flywheel_train_last_step_timestamp_seconds', lookback_seconds)}")


def final_save_query(lookback_seconds: int) -> str:
    return _last("flywheel_train_final_save_started_timestamp_seconds", lookback_seconds)


def process_start_query(lookback_seconds: int) -> str:
    return _last("flywheel_train_started_timestamp_seconds", lookback_seconds)


def step_time_query(window_seconds: int) -> str:
    return (f"sum by ({RANK_LABELS}) (rate(flywheel_train_step_seconds_sum[{window_seconds}s]))"
            f" / sum by ({RANK_LABELS}) (rate(flywheel_train_step_seconds_count[{window_seconds}s]))")


XID_QUERY = "DCGM_FI_DEV_XID_ERRORS"


def _rank(labels: dict[str, str]) -> tuple[str, str, str, str] | None:
    if {"namespace", "job", "replica", "rank"} <= labels.keys():
        return labels["namespace"], labels["job"], labels["replica"], labels["rank"]
    return None


def parse_progress(samples: list[Sample], final_saves: list[Sample] | None = None,
                   starts: list[Sample] | None = None) -> list[RankProgress]:
    """Each rank's last progress, with when its final save began (`final_saves`: final_save_query's answer) and
    when its newest process started (`starts`: process_start_query's)."""
    saving, started = _by_rank(final_saves), _by_rank(starts)
    out = []
    for s in finite(samples):
        key = _rank(s.labels)
        if key is not None:
            out.append(RankProgress(*key, s.value, final_save_started=saving.get(key, 0.0),
                                    process_started=started.get(key, 0.0)))
    return out


def _by_rank(samples: list[Sample] | None) -> dict[tuple[str, str, str, str], float]:
    return {key: s.value for s in finite(samples or []) if (key := _rank(s.labels)) is not None}


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
