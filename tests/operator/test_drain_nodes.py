"""Drain ahead, the operator's node observations (operator/drain.py, caches.py): pure."""

from __future__ import annotations

from typing import Any

from flywheel.operator import caches
from flywheel.operator.drain import DEFAULT_DRAIN_TAINT_KEYS, node_entry, node_marks
from flywheel.policy.drain import NodeMarks


def node(name: str, unschedulable: bool = False, taints: list[dict[str, str]] | None = None,
         ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"unschedulable": unschedulable, "taints": taints or []},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_only_cordoned_or_blocking_tainted_nodes_are_kept_slim() -> None:
    assert node_entry(node("a")) is None
    assert node_entry(node("a", taints=[{"key": "x", "effect": "PreferNoSchedule"}])) is None
    assert node_entry(node("a", unschedulable=True)) == ("a", True, ())
    assert node_entry(node("a", taints=[{"key": "k2", "effect": "NoExecute"}, {"key": "k1", "effect": "NoSchedule"}])) \
        == ("a", False, ("k1", "k2"))


def test_the_index_entry_carries_lost_marked_and_usable_nodes() -> None:
    assert caches.node_entry(node("a")) == {caches.USABLE: "a"}
    assert caches.node_entry(node("a", taints=[{"key": "x", "effect": "PreferNoSchedule"}])) == {caches.USABLE: "a"}
    assert caches.node_entry(node("a", taints=[{"key": "x", "effect": "NoSchedule"}])) == {
        caches.MARKS: ("a", False, ("x",))}
    assert caches.node_entry(node("a", ready=False)) == {caches.LOST: "a"}
    assert caches.node_entry(node("a", unschedulable=True, ready=False)) == {caches.LOST: "a",
                                                                              caches.MARKS: ("a", True, ())}


def test_only_configured_taint_keys_mark_a_node() -> None:
    entries = [("a", False, ("team/dedicated",)), ("b", False, ("nvidia.com/gpu-xid-error", "team/dedicated")),
               ("c", True, ())]
    marks = node_marks(entries, DEFAULT_DRAIN_TAINT_KEYS)
    assert marks == {"b": NodeMarks(taints=("nvidia.com/gpu-xid-error",)), "c": NodeMarks(unschedulable=True)}


def test_a_fatal_xid_marks_its_node() -> None:
    marks = node_marks([("a", True, ())], (), {"a": "XID 79", "b": "XID 48"})
    assert marks["a"] == NodeMarks(unschedulable=True, fatal_xid="XID 79") and marks["b"].cause is not None


def test_the_flag_and_the_chart_default_to_the_same_keys() -> None:
    from pathlib import Path

    import yaml

    from flywheel.operator.main import build_parser, drain_taint_keys

    values = yaml.safe_load((Path(__file__).parents[2] / "charts/flywheel/values.yaml").read_text())
    assert tuple(values["operator"]["drainTaintKeys"]) == DEFAULT_DRAIN_TAINT_KEYS
    assert drain_taint_keys(build_parser().parse_args([]).drain_taint_keys) == DEFAULT_DRAIN_TAINT_KEYS
    assert drain_taint_keys(" a, ,b ") == ("a", "b") and drain_taint_keys("") == ()
