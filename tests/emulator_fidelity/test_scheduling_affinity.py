"""The test cluster's inter-pod affinity, as pure functions (scheduling.py): the incoming pod's required pod
(anti-)affinity filters nodes by the pods in each node's topology domain, its preferred terms score them."""

from __future__ import annotations

from typing import Any

from tests.k8s_emulator import scheduling
from tests.k8s_emulator.scheduling import AFFINITY_MISFIT, ANTI_AFFINITY_MISFIT, Neighbours

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def node(name: str, zone: str | None = None) -> dict[str, Any]:
    labels = {HOST: name, **({ZONE: zone} if zone else {})}
    return {"metadata": {"name": name, "labels": labels}, "spec": {}, "status": {}}


def pod(labels: dict[str, str] | None = None, node_name: str = "", namespace: str = "default",
        phase: str = "Running", affinity: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main"}]}
    if node_name:
        spec["nodeName"] = node_name
    if affinity:
        spec["affinity"] = affinity
    return {"metadata": {"name": "p", "namespace": namespace, "labels": labels or {}}, "spec": spec,
            "status": {"phase": phase}}


def term(key: str = HOST, **selector: str) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": selector}, "topologyKey": key}


def required(kind: str, *terms: dict[str, Any]) -> dict[str, Any]:
    return {kind: {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}}


def preferred(kind: str, weight: int, podterm: dict[str, Any]) -> dict[str, Any]:
    return {kind: {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": weight,
                                                                          "podAffinityTerm": podterm}]}}


NODES = [node("n1", "a"), node("n2", "a"), node("n3", "b")]


def feasible(incoming: dict[str, Any], pods: list[dict[str, Any]],
             nodes: list[dict[str, Any]] = NODES) -> tuple[list[str], dict[str, str]]:
    return scheduling.feasible_nodes(incoming, nodes, pods, lost=set())


def test_required_anti_affinity_keeps_matching_pods_out_of_the_domain() -> None:
    anti = pod({"app": "w"}, affinity=required("podAntiAffinity", term(app="w")))
    fit, misfits = feasible(anti, [pod({"app": "w"}, "n1"), pod({"app": "other"}, "n2")])
    assert fit == ["n2", "n3"] and misfits == {"n1": ANTI_AFFINITY_MISFIT}
    zonal = pod({"app": "w"}, affinity=required("podAntiAffinity", term(ZONE, app="w")))
    assert feasible(zonal, [pod({"app": "w"}, "n1")])[0] == ["n3"]
    fit, misfits = feasible(anti, [pod({"app": "w"}, name) for name in ("n1", "n2", "n3")])
    assert fit == [] and scheduling.unschedulable_message(misfits) == (
        "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules. "
        "preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod.")


def test_terminal_and_unbound_pods_do_not_count_but_terminating_ones_do() -> None:
    anti = pod({"app": "w"}, affinity=required("podAntiAffinity", term(app="w")))
    terminating = pod({"app": "w"}, "n2")
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    others = [pod({"app": "w"}, "n1", phase="Succeeded"), pod({"app": "w"}, "n3", phase="Failed"),
              pod({"app": "w"}), terminating]
    assert feasible(anti, others)[0] == ["n1", "n3"]


def test_required_affinity_co_locates_in_the_topology_domain() -> None:
    follower = pod({"app": "other"}, affinity=required("podAffinity", term(ZONE, app="w")))
    fit, misfits = feasible(follower, [pod({"app": "w"}, "n2")])
    assert fit == ["n1", "n2"] and misfits == {"n3": AFFINITY_MISFIT}
    fit, misfits = feasible(follower, [])
    assert fit == [] and scheduling.unschedulable_message(misfits) == (
        "0/3 nodes are available: 3 node(s) didn't match pod affinity rules. "
        "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.")


def test_the_first_pod_of_a_self_affine_group_goes_anywhere_with_the_label() -> None:
    first = pod({"app": "w"}, affinity=required("podAffinity", term(ZONE, app="w")))
    assert feasible(first, [], [*NODES, node("no-zone")])[0] == ["n1", "n2", "n3"]
    assert feasible(first, [pod({"app": "w"}, "n3")])[0] == ["n3"]
    elsewhere = pod({"app": "w"}, "n3", namespace="other")
    assert feasible(first, [elsewhere])[0] == ["n1", "n2", "n3"]  # the term looks in the pod's own namespace


def test_term_namespaces_and_selectors() -> None:
    across = term(app="w") | {"namespaceSelector": {}}
    assert feasible(pod(affinity=required("podAntiAffinity", across)), [pod({"app": "w"}, "n1", "x")])[0] == \
        ["n2", "n3"]
    listed = term(app="w") | {"namespaces": ["x"]}
    assert feasible(pod(affinity=required("podAntiAffinity", listed)),
                    [pod({"app": "w"}, "n1", "x"), pod({"app": "w"}, "n2")])[0] == ["n2", "n3"]
    labelled = term(app="w") | {"namespaceSelector": {"matchLabels": {"team": "a"}}}
    around = Neighbours.of([pod({"app": "w"}, "n1", "x"), pod({"app": "w"}, "n2", "y")], NODES,
                           [{"metadata": {"name": "x", "labels": {"team": "a"}}}, {"metadata": {"name": "y"}}])
    fit, _ = scheduling.feasible_nodes(pod(affinity=required("podAntiAffinity", labelled)), NODES, [], set(), around)
    assert fit == ["n2", "n3"]
    expressions = {"labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["w", "v"]},
                                                          {"key": "spare", "operator": "DoesNotExist"}]},
                   "topologyKey": HOST}
    pods = [pod({"app": "v"}, "n1"), pod({"app": "w", "spare": "1"}, "n2")]
    assert feasible(pod(affinity=required("podAntiAffinity", expressions)), pods)[0] == ["n2", "n3"]
    no_selector = {"topologyKey": HOST}  # a null labelSelector selects no pod
    assert feasible(pod(affinity=required("podAntiAffinity", no_selector)), pods)[0] == ["n1", "n2", "n3"]


def test_preferred_anti_affinity_avoids_but_does_not_forbid() -> None:
    spare = pod({"role": "spare"}, affinity=preferred("podAntiAffinity", 50, term(role="worker")))
    workers = [pod({"role": "worker"}, "n1"), pod({"role": "worker"}, "n1"), pod({"role": "worker"}, "n2")]
    around = Neighbours.of(workers, NODES)
    assert [scheduling.affinity_score(spare, n, around) for n in ("n1", "n2", "n3")] == [-100, -50, 0]
    assert scheduling.best_scored(spare, ["n1", "n2", "n3"], around) == {"n3"}
    assert scheduling.best_scored(spare, ["n1", "n2"], around) == {"n2"}


def test_preferred_affinity_pulls_to_the_domain_and_no_terms_tie_everywhere() -> None:
    follower = pod(affinity=preferred("podAffinity", 100, term(ZONE, job="j")))
    around = Neighbours.of([pod({"job": "j"}, "n3")], NODES)
    assert scheduling.best_scored(follower, ["n1", "n2", "n3"], around) == {"n3"}
    assert scheduling.best_scored(follower, ["n1", "n2"], around) == {"n1", "n2"}
    assert scheduling.best_scored(pod(), ["n1", "n2", "n3"], around) == {"n1", "n2", "n3"}
