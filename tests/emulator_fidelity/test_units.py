"""Pure pieces of the emulator: selectors, patches, CEL, structural schemas, and store rules."""

from __future__ import annotations

import asyncio

import pytest

from tests.k8s_emulator import cel, patches, pdb, schema
from tests.k8s_emulator.errors import StatusError
from tests.k8s_emulator.resources import Registry
from tests.k8s_emulator.selectors import field_selector, label_selector
from tests.k8s_emulator.store import Store


def _labelled(**labels: str) -> dict:
    return {"metadata": {"name": "x", "namespace": "ns", "labels": labels}, "status": {"phase": "Running"}}


@pytest.mark.parametrize(("selector", "matches"), [
    ("app=web", True), ("app==web", True), ("app!=web", False), ("app in (db, web)", True),
    ("app notin (web)", False), ("tier", True), ("!tier", False), ("missing", False), ("!missing", True),
    ("app=web,tier in (front),!missing", True), ("app=web,tier=back", False),
])
def test_label_selectors(selector: str, matches: bool) -> None:
    assert label_selector(selector)(_labelled(app="web", tier="front")) is matches


def test_field_selectors_and_bad_selector() -> None:
    obj = _labelled()
    assert field_selector("metadata.name=x,status.phase!=Failed")(obj)
    assert not field_selector("spec.nodeName=node-1")(obj)
    assert field_selector("spec.nodeName=")(obj)  # a missing field is the empty string
    with pytest.raises(StatusError):
        label_selector("app in web")(obj)


def test_merge_and_json_patch() -> None:
    doc = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert patches.merge_patch(doc, {"a": {"b": None, "c": [3]}, "e": 2}) == {"a": {"c": [3]}, "d": 1, "e": 2}
    ops = [{"op": "add", "path": "/a/c/-", "value": 3}, {"op": "replace", "path": "/d", "value": 5},
           {"op": "move", "from": "/a/b", "path": "/b"}, {"op": "test", "path": "/d", "value": 5}]
    assert patches.json_patch(doc, ops) == {"a": {"c": [1, 2, 3]}, "d": 5, "b": 1}
    assert doc == {"a": {"b": 1, "c": [1, 2]}, "d": 1}  # inputs are never mutated
    with pytest.raises(StatusError) as failed:
        patches.json_patch(doc, [{"op": "test", "path": "/d", "value": 9}])
    assert failed.value.code == 422


def test_strategic_merge_uses_merge_keys() -> None:
    pod = {"spec": {"containers": [{"name": "a", "image": "x", "env": [{"name": "K", "value": "1"}]},
                                   {"name": "b", "image": "y"}]},
           "metadata": {"finalizers": ["f1"]}}
    patch = {"spec": {"containers": [{"name": "a", "env": [{"name": "J", "value": "2"}]},
                                     {"name": "b", "$patch": "delete"}]},
             "metadata": {"finalizers": ["f2"]}}
    merged = patches.strategic_merge(pod, patch)
    assert merged["spec"]["containers"] == [{"name": "a", "image": "x", "env": [{"name": "K", "value": "1"},
                                                                                {"name": "J", "value": "2"}]}]
    assert merged["metadata"]["finalizers"] == ["f1", "f2"]
    removed = patches.strategic_merge(merged, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["f1"]}})
    assert removed["metadata"]["finalizers"] == ["f2"]


@pytest.mark.parametrize(("rule", "value", "expected"), [
    ("self.min <= self.max", {"min": 1, "max": 2}, True),
    ("!has(self.target) || (self.target >= self.min && self.target <= self.max)", {"min": 1, "max": 2}, True),
    ("!has(self.target) || self.target <= self.max", {"max": 2, "target": 3}, False),
    ("self.dim % self.heads == 0", {"dim": 12, "heads": 5}, False),
    ("size(self.command) > 0 || self.x.auto", {"command": [], "x": {"auto": True}}, True),
    ("size(self.name) <= 3 && self.name.startsWith('a')", {"name": "abc"}, True),
    ("self.items.all(i, i > 0) && 2 in self.items", {"items": [1, 2]}, True),
    ("self.a > 0 ? self.b == 'x' : true", {"a": 1, "b": "y"}, False),
    ("self.missing > 1 || true", {}, True),  # CEL's || absorbs an error on one side
])
def test_cel_subset(rule: str, value: dict, expected: bool) -> None:
    assert cel.evaluate(rule, value) is expected


def test_cel_errors_and_unsupported() -> None:
    with pytest.raises(cel.CelError):
        cel.evaluate("self.missing > 1", {})
    with pytest.raises(cel.CelUnsupported):
        cel.evaluate("self.a.map(x, x * 2)", {"a": [1]})


def test_schema_prunes_defaults_and_validates() -> None:
    root = {"type": "object", "properties": {"spec": {"type": "object", "required": ["n"], "properties": {
        "n": {"type": "integer", "minimum": 1}, "mode": {"type": "string", "default": "fast", "enum": ["fast"]},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "nested": {"type": "object", "default": {}, "properties": {"k": {"type": "integer", "default": 7}}}}}}}
    obj = {"apiVersion": "v", "kind": "K", "metadata": {"name": "x"},
           "spec": {"n": 0, "extra": 1, "free": {"anything": [1]}}}
    admitted, dropped, errors = schema.admit(obj, root, None)
    assert dropped == ["spec.extra"]
    assert admitted["spec"]["mode"] == "fast" and admitted["spec"]["nested"] == {"k": 7}
    assert admitted["spec"]["free"] == {"anything": [1]}
    assert errors == ["spec.n: Invalid value: 0: spec.n in body should be greater than or equal to 1"]
    _, _, missing = schema.admit({"spec": {"n": "one"}}, root, None)
    assert missing == ['spec.n: Invalid value: "one": spec.n in body must be of type integer: "str"']


def test_store_rules_generation_noop_and_graceful_pod_delete() -> None:
    async def scenario() -> None:
        registry = Registry()
        store = Store(registry)
        configmaps, pods = registry.get(("", "configmaps")), registry.get(("", "pods"))
        created = store.create(configmaps, "default", {"metadata": {"name": "c"}, "data": {"a": "1"}})
        same = store.update(configmaps, "default", "c", created)
        assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]  # no-op write
        pod = store.create(pods, "default", {"metadata": {"name": "p"}, "spec": {
            "nodeName": "node-1", "containers": [{"name": "m", "image": "i"}]}})
        deleting = store.delete(pods, "default", "p")
        assert deleting["metadata"]["deletionGracePeriodSeconds"] == 30  # waits for the kubelet
        assert store.delete(pods, "default", "p", grace=0)["metadata"]["uid"] == pod["metadata"]["uid"]
        assert store.peek(("", "pods"), "default", "p") is None
        with pytest.raises(StatusError) as invalid:
            store.create(pods, "default", {"metadata": {"name": "Bad_Name"}, "spec": {"containers": []}})
        assert invalid.value.code == 422

    asyncio.run(scenario())


def test_status_write_on_a_deleting_object_keeps_it() -> None:
    async def scenario() -> None:
        registry = Registry()
        store = Store(registry)
        configmaps = registry.get(("", "configmaps"))
        store.create(configmaps, "default", {"metadata": {"name": "c", "finalizers": ["keep"]}})
        store.delete(configmaps, "default", "c")
        held = store.get(configmaps, "default", "c")
        held["metadata"].pop("finalizers")
        held["data"] = {"k": "v"}
        store.update(configmaps, "default", "c", held, subresource="status")  # metadata changes are ignored
        assert store.peek(("", "configmaps"), "default", "c")["metadata"]["finalizers"] == ["keep"]

    asyncio.run(scenario())


def test_the_budgets_pod_index_selects_as_each_selector_does() -> None:
    """pods_by_budget (one walk over the pods) against selects() on every pair: matchLabels of several pairs,
    expressions only, an empty selector (every pod of its namespace), a null one (none), another namespace."""
    selectors = {"one-pair": {"matchLabels": {"app": "web"}},
                 "two-pairs": {"matchLabels": {"app": "web", "tier": "front"}},
                 "mixed": {"matchLabels": {"tier": "front"}, "matchExpressions": [
                     {"key": "app", "operator": "NotIn", "values": ["db"]}]},
                 "expressions": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]},
                 "empty": {}, "null": None}
    pod_labels = [{"app": "web", "tier": "front"}, {"app": "web"}, {"app": "db", "tier": "front"}, {}, {"tier": "x"}]

    async def scenario() -> None:
        registry = Registry()
        store = Store(registry)
        pods, budgets = registry.get(pdb.PODS), registry.get(pdb.PDBS)
        store.create(registry.get(("", "namespaces")), "", {"metadata": {"name": "other"}})
        for namespace in ("default", "other"):
            for i, labels in enumerate(pod_labels):
                store.create(pods, namespace, {"metadata": {"name": f"p{i}", "labels": labels}, "spec": {
                    "containers": [{"name": "m", "image": "i"}]}})
        for name, selector in selectors.items():
            store.create(budgets, "default", {"metadata": {"name": name},
                                              "spec": {"selector": selector, "minAvailable": 1}})
        indexed = {b["metadata"]["name"]: sorted(p["metadata"]["name"] for p in selected)
                   for b, selected in pdb.pods_by_budget(store)}
        every_pair = {b["metadata"]["name"]: sorted(p["metadata"]["name"] for p in store.bucket(pdb.PODS).values()
                                                    if pdb.selects(b, p))
                      for b in store.bucket(pdb.PDBS).values()}
        assert indexed == every_pair
        assert indexed == {"one-pair": ["p0", "p1"], "two-pairs": ["p0"], "mixed": ["p0"],
                           "expressions": ["p0", "p2", "p4"], "empty": ["p0", "p1", "p2", "p3", "p4"], "null": []}
        # a pass after writes: the budgets that select a written pod, and those written, each with all its pods
        written = store.peek(pdb.PODS, "default", "p1")
        touched = {b["metadata"]["name"]: sorted(p["metadata"]["name"] for p in selected)
                   for b, selected in pdb.pods_by_budget(store, [written], {("default", "null")})}
        assert touched == {k: indexed[k] for k in ("one-pair", "empty", "null")}
        assert pdb.pods_by_budget(store, [], set()) == []

    asyncio.run(scenario())
