"""XID classification, change-based events and the actions they lead to (pure)."""

from __future__ import annotations

import pytest

from flywheel.policy.xid import (
    APP_XIDS,
    FATAL_XIDS,
    IGNORED_XIDS,
    WatchedPod,
    XidClass,
    XidSample,
    classify_xid,
    decide_xids,
    same_node,
    xid_events,
)


def pod(name: str, node: str, job: str = "train", phase: str = "Running", namespace: str = "ml") -> WatchedPod:
    return WatchedPod(name, namespace, job, name.rsplit("-", 1)[-1], node, phase, 0.0)


PODS = [pod("train-worker-0", "node-a"), pod("train-worker-1", "node-b"), pod("other-worker-0", "node-a", job="other")]


@pytest.mark.parametrize("code", [46, 48, 62, 64, 74, 79, 95, 119, 120, 140])
def test_fatal_codes(code: int) -> None:
    assert classify_xid(code) is XidClass.FATAL


@pytest.mark.parametrize("code", [13, 31, 43, 45, 94])
def test_app_codes(code: int) -> None:
    assert classify_xid(code) is XidClass.APP


@pytest.mark.parametrize("code", [63, 92])
def test_ignored_codes(code: int) -> None:
    assert classify_xid(code) is XidClass.IGNORED


@pytest.mark.parametrize("code", [1, 8, 32, 61, 68, 69, 79 + 1000, 154])
def test_unknown_codes(code: int) -> None:
    assert classify_xid(code) is XidClass.UNKNOWN


def test_classes_are_disjoint_and_match_design() -> None:
    assert not (FATAL_XIDS & APP_XIDS or FATAL_XIDS & IGNORED_XIDS or APP_XIDS & IGNORED_XIDS)
    assert sorted(FATAL_XIDS) == [46, 48, 62, 64, 74, 79, 95, 119, 120, 140]


def test_events_are_changes_not_levels() -> None:
    first = [XidSample("node-a", "GPU-0", 13)]
    events, memory = xid_events({}, first)
    assert [e.sample.code for e in events] == [13]
    events, memory = xid_events(memory, first)  # same level again: nothing new
    assert events == []
    events, memory = xid_events(memory, [XidSample("node-a", "GPU-0", 31)])  # a different code is a new event
    assert [(e.sample.code, e.xid_class) for e in events] == [(31, XidClass.APP)]
    events, _ = xid_events(memory, [XidSample("node-a", "GPU-0", 0)])  # back to "No Error"
    assert events == []


def test_same_code_on_another_gpu_is_an_event() -> None:
    _, memory = xid_events({}, [XidSample("node-a", "GPU-0", 79)])
    events, _ = xid_events(memory, [XidSample("node-a", "GPU-0", 79), XidSample("node-a", "GPU-1", 79)])
    assert [e.sample.gpu for e in events] == ["GPU-1"]


def test_first_evaluation_acts_on_present_fatal_only() -> None:
    samples = [XidSample("node-a", "GPU-0", 79), XidSample("node-b", "GPU-0", 13), XidSample("node-c", "GPU-0", 63)]
    events, memory = xid_events(None, samples)
    assert [(e.sample.node, e.xid_class) for e in events] == [("node-a", XidClass.FATAL)]
    assert memory == {("node-a", "GPU-0"): 79, ("node-b", "GPU-0"): 13, ("node-c", "GPU-0"): 63}


def test_vanished_series_reappearing_is_an_event() -> None:
    _, memory = xid_events({}, [XidSample("node-a", "GPU-0", 13)])
    _, memory = xid_events(memory, [])  # exporter restarted: series gone
    events, _ = xid_events(memory, [XidSample("node-a", "GPU-0", 13)])
    assert len(events) == 1


def events_for(*samples: XidSample):
    return xid_events({}, samples)[0]


def test_fatal_xid_cordons_and_replaces_every_job_pod_on_the_node() -> None:
    d = decide_xids(events_for(XidSample("node-a", "GPU-0", 79, "train-worker-0", "ml")), PODS, cordon=True,
                    now=100, restart_cooldown_seconds=60, restarted_at={})
    assert len(d.node_faults) == 1
    fault = d.node_faults[0]
    assert fault.node == "node-a" and fault.codes == (79,) and fault.cordon
    assert [p.name for p in fault.pods] == ["other-worker-0", "train-worker-0"]
    assert d.rank_restarts == () and d.notices == ()
    assert "79" in fault.message and "node-a" in fault.message


def test_cordon_follows_the_setting() -> None:
    d = decide_xids(events_for(XidSample("node-a", "GPU-0", 48)), PODS, cordon=False, now=0,
                    restart_cooldown_seconds=60, restarted_at={})
    assert d.node_faults[0].cordon is False


def test_fatal_xids_on_one_node_merge() -> None:
    d = decide_xids(events_for(XidSample("node-a", "GPU-0", 79), XidSample("node-a", "GPU-1", 48)), PODS,
                    cordon=True, now=0, restart_cooldown_seconds=60, restarted_at={})
    assert [(f.node, f.codes) for f in d.node_faults] == [("node-a", (48, 79))]


def test_fatal_xid_on_a_node_without_job_pods_is_only_a_notice() -> None:
    d = decide_xids(events_for(XidSample("node-z", "GPU-0", 79)), PODS, cordon=True, now=0,
                    restart_cooldown_seconds=60, restarted_at={})
    assert d.node_faults == () and [e.sample.node for e in d.notices] == ["node-z"]


def test_terminal_pods_are_not_replaced() -> None:
    pods = [pod("train-worker-0", "node-a", phase="Succeeded")]
    d = decide_xids(events_for(XidSample("node-a", "GPU-0", 79)), pods, cordon=True, now=0,
                    restart_cooldown_seconds=60, restarted_at={})
    assert d.node_faults == ()


def test_hostname_may_be_an_fqdn() -> None:
    assert same_node("node-a.cluster.local", "node-a") and same_node("node-a", "node-a")
    assert not same_node("node-a", "node-ab")
    d = decide_xids(events_for(XidSample("node-b.example.internal", "GPU-0", 79)), PODS, cordon=True, now=0,
                    restart_cooldown_seconds=60, restarted_at={})
    assert [p.name for p in d.node_faults[0].pods] == ["train-worker-1"]


def test_app_xid_restarts_the_pod_using_the_gpu() -> None:
    d = decide_xids(events_for(XidSample("node-a", "GPU-0", 13, "train-worker-0", "ml")), PODS, cordon=True, now=10,
                    restart_cooldown_seconds=60, restarted_at={})
    assert d.node_faults == ()
    assert [(r.job, r.pods, r.codes) for r in d.rank_restarts] == [("train", ("train-worker-0",), (13,))]
    assert d.restarted_at == {("ml", "train-worker-0"): 10}


def test_app_xid_without_pod_label_restarts_job_pods_on_the_node_per_job() -> None:
    d = decide_xids(events_for(XidSample("node-a", "GPU-3", 31)), PODS, cordon=True, now=0,
                    restart_cooldown_seconds=60, restarted_at={})
    assert sorted((r.job, r.pods) for r in d.rank_restarts) == [("other", ("other-worker-0",)),
                                                                 ("train", ("train-worker-0",))]


def test_app_xid_restart_cooldown() -> None:
    ev = events_for(XidSample("node-a", "GPU-0", 13, "train-worker-0", "ml"))
    first = decide_xids(ev, PODS, cordon=True, now=0, restart_cooldown_seconds=60, restarted_at={})
    again = decide_xids(ev, PODS, cordon=True, now=30, restart_cooldown_seconds=60, restarted_at=first.restarted_at)
    assert again.rank_restarts == ()
    later = decide_xids(ev, PODS, cordon=True, now=61, restart_cooldown_seconds=60, restarted_at=again.restarted_at)
    assert [r.pods for r in later.rank_restarts] == [("train-worker-0",)]
    assert later.restarted_at == {("ml", "train-worker-0"): 61}  # old entries expire


def test_pod_replaced_for_fatal_is_not_also_restarted() -> None:
    d = decide_xids(events_for(XidSample("node-a", "GPU-0", 79), XidSample("node-a", "GPU-1", 13, "train-worker-0",
                                                                            "ml")),
                    PODS, cordon=True, now=0, restart_cooldown_seconds=60, restarted_at={})
    assert d.rank_restarts == () and len(d.node_faults) == 1
    assert d.restarted_at == {}


@pytest.mark.parametrize("code", [63, 92, 8, 61])
def test_ignored_and_unknown_are_notices(code: int) -> None:
    d = decide_xids(events_for(XidSample("node-a", "GPU-0", code, "train-worker-0", "ml")), PODS, cordon=True, now=0,
                    restart_cooldown_seconds=60, restarted_at={})
    assert d.node_faults == () and d.rank_restarts == () and len(d.notices) == 1


def test_a_hundred_non_fatal_events_never_drain() -> None:
    memory: dict | None = None
    restarted: dict = {}
    restarts = 0
    cycle = [13, 31, 43, 45, 94, 63, 92, 8]
    for i in range(120):
        events, memory = xid_events(memory, [XidSample("node-a", "GPU-0", cycle[i % len(cycle)], "train-worker-0",
                                                        "ml")])
        d = decide_xids(events, PODS, cordon=True, now=i * 1.0, restart_cooldown_seconds=60, restarted_at=restarted)
        restarted = dict(d.restarted_at)
        assert d.node_faults == ()
        restarts += len(d.rank_restarts)
    # t=0 is the baseline; then restarts at t=1 and t=64 (first app code after the cooldown): one a minute
    assert restarts == 2
