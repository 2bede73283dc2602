"""bench/operator_scale's pure parts: the request count by caller, and the figures and their goals."""

from __future__ import annotations

import pytest

from bench.operator_scale import figures, rows
from bench.operator_scale_bed import pod_status, split_counts
from tests.cluster.audit import Entry, Recorded


def test_requests_are_counted_per_caller_with_watches_apart():
    """From the audit log's entries (tests/cluster/audit.py: one per request, as the authorizer sees it)."""
    pods, job = ("", "pods", "default"), ("flywheel.dev", "trainingjobs/status", "default")
    entries = [*(Entry("op", ("list", *pods), 200) for _ in range(3)), Entry("op", ("watch", *pods), 200),
               Entry("op", ("patch", *job), 200), Entry("bench", ("get", "flywheel.dev", "trainingjobs", "default"),
                                                         200)]
    counts = Recorded(entries).counts
    requests, watches, by_kind = split_counts(counts, "op")
    assert (requests, watches) == (4, 1)
    assert by_kind == {"list pods": 3, "watch pods": 1, "patch trainingjobs/status": 1}
    assert split_counts(counts, "bench")[:2] == (1, 0)


def test_stand_in_pod_status_reads_as_running_and_ready_then_succeeded():
    running, done = pod_status("Running")["status"], pod_status("Succeeded")["status"]
    assert running["phase"] == "Running" and running["conditions"][0]["type"] == "Ready"
    assert running["conditions"][0]["status"] == "True" and done["phase"] == "Succeeded"
    assert done["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


def runs(per_job_minute: float, ours_cpu: float, peer_cpu: float, ours_jps: float, peer_jps: float,
         bare_jps: float = 400.0) -> dict:
    return {"wide": {"replicas": 64, "latency_s": [0.1, 0.2, 0.3]},
            "steady": {"jobs": 200, "hold_s": 120.0, "per_job_minute": per_job_minute},
            "burst": {"jobs": 500, "cpu_s_per_job": ours_cpu, "jobs_per_second": ours_jps},
            "kopf_peer": {"cpu_s_per_job": peer_cpu, "jobs_per_second": peer_jps},
            "bare_client": {"jobs_per_second": bare_jps}, "rss_peak_mb": 150.0}


def test_figures_are_ratios_to_their_peers_and_judged_by_the_issues_goals():
    good = figures(runs(0.5, 0.012, 0.01, 95.0, 100.0))
    assert good["operator_cpu_ratio"] == pytest.approx(1.2) and good["burst_throughput_ratio"] == pytest.approx(0.95)
    assert good["bare_client_ratio"] == pytest.approx(95.0 / 400.0)  # shown, judged by no goal
    assert all(good["goals"].values())
    bad = figures(runs(138.0, 0.03, 0.01, 85.0, 100.0, bare_jps=90.0))
    assert not bad["goals"]["api_requests_per_job_minute"] and not bad["goals"]["operator_cpu_ratio"]
    assert not bad["goals"]["burst_throughput_ratio"] and bad["goals"]["wide_pods_p99_s"]
    table = {row["name"]: row for row in rows(bad, runs(138.0, 0.03, 0.01, 85.0, 100.0, bare_jps=90.0))}
    assert table["burst"]["ratio"] == pytest.approx(0.85) and not table["burst"]["pass"]
    assert table["burst"]["peer"].startswith("minimal kopf operator") and table["burst_bare"]["goal"] == "none"
    assert table["requests"]["value"] == 138.0 and table["requests"]["peer"] == "goal"


def test_a_wide_run_that_never_saw_its_pods_fails_the_wide_goal():
    measured = runs(0.0, 0.01, 0.01, 100.0, 100.0)
    measured["wide"]["latency_s"] = [0.1, None]
    assert not figures(measured)["goals"]["wide_pods_p99_s"]
