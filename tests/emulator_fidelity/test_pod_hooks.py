"""The test cluster's pod mutation (tests/k8s_emulator/pod_hooks.py): on one host, worker i's metrics port moves to
base + i, in its env and its containerPort, at creation; pods without the ordinal label or with port 0 stay as
they are. The operator's own pods are what a real cluster gets: every worker on the base port."""

from __future__ import annotations

import asyncio
from typing import Any

from flywheel.labels import INDEX_LABEL
from tests.k8s_emulator.pod_hooks import DEFAULT_POD_HOOKS, spread_host_ports
from tests.k8s_emulator.resources import Registry
from tests.k8s_emulator.store import Store


def _pod(index: str | None, port: str) -> dict[str, Any]:
    labels = {INDEX_LABEL: index} if index is not None else {}
    return {"metadata": {"name": f"w-{index}", "namespace": "default", "labels": labels},
            "spec": {"containers": [{"name": "worker", "image": "flywheel",
                                     "env": [{"name": "FLYWHEEL_METRICS_PORT", "value": port},
                                             {"name": "OTHER", "value": port}],
                                     "ports": [{"name": "metrics", "containerPort": int(port)}]}]}}


def _port(pod: dict[str, Any]) -> tuple[str, int, str]:
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    return env["FLYWHEEL_METRICS_PORT"], container["ports"][0]["containerPort"], env["OTHER"]


def test_spread_host_ports_moves_only_the_named_port_of_labelled_pods() -> None:
    hook = spread_host_ports()
    for index, port, expected in (("0", "9400", ("9400", 9400, "9400")), ("3", "9400", ("9403", 9403, "9400")),
                                  (None, "9400", ("9400", 9400, "9400")), ("2", "0", ("0", 0, "0"))):
        pod = _pod(index, port)
        hook(pod)
        assert _port(pod) == expected, (index, port)


def test_the_cluster_store_applies_its_pod_hooks_at_creation() -> None:
    async def scenario() -> None:
        registry = Registry()
        store = Store(registry)
        store.pod_hooks.extend(DEFAULT_POD_HOOKS)
        created = store.create(registry.get(("", "pods")), "default", _pod("1", "9400"))
        assert _port(created) == ("9401", 9401, "9400")
        assert _port(store.peek(("", "pods"), "default", "w-1")) == ("9401", 9401, "9400")

    asyncio.run(scenario())
