"""What the test cluster does to a pod when it is created, as a real cluster's mutating admission webhooks do.

The emulator runs every pod as a process on one host, so all pods share one network namespace, where a real
cluster gives each pod its own: two workers that each serve metrics on port 9400 would collide here. The default
hook, `spread_host_ports`, moves the port of each pod with an ordinal label (a worker's replica index) to
`port + ordinal` -- in the env var that tells the process where to listen and in the matching `containerPort` --
so the operator's pods stay exactly what a real cluster gets (every worker on the same port) and the test cluster
decides the mapping itself. A test scrapes worker *i* at `base + i`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flywheel.labels import INDEX_LABEL

PodHook = Callable[[dict[str, Any]], None]
PORT_ENV = ("FLYWHEEL_METRICS_PORT",)


def spread_host_ports(ordinal_label: str = INDEX_LABEL, env_names: tuple[str, ...] = PORT_ENV) -> PodHook:
    """A hook that adds the pod's ordinal (label `ordinal_label`) to every nonzero port in `env_names`."""

    def hook(pod: dict[str, Any]) -> None:
        ordinal = ((pod.get("metadata") or {}).get("labels") or {}).get(ordinal_label, "")
        if not str(ordinal).isdigit() or int(ordinal) == 0:
            return
        for container in (pod.get("spec") or {}).get("containers") or []:
            for var in container.get("env") or []:
                value = str(var.get("value", ""))
                if var.get("name") in env_names and value.isdigit() and int(value):
                    var["value"] = str(int(value) + int(ordinal))
                    for port in container.get("ports") or []:
                        if port.get("containerPort") == int(value):
                            port["containerPort"] = int(value) + int(ordinal)

    return hook


DEFAULT_POD_HOOKS: tuple[PodHook, ...] = (spread_host_ports(),)
