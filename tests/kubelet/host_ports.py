"""One host network for every pod: the process kubelet runs pods as host processes, so they share one network
namespace where a real cluster gives each pod its own, and two workers that each serve metrics on port 9400 would
collide. The kubelet moves the port of each pod with an ordinal label (a worker's replica index) to
`port + ordinal` in the environment it starts the container with -- the env var that tells the process where to
listen -- as a host-port mapping would; the pod object keeps what the operator made (every worker on the same
port). A test scrapes worker *i* at `base + i`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flywheel.contracts.labels import INDEX_LABEL

PORT_ENV = ("FLYWHEEL_METRICS_PORT",)


def spread(pod: Mapping[str, Any], env: dict[str, str]) -> dict[str, str]:
    """`env` with each nonzero port of PORT_ENV moved by the pod's ordinal (label INDEX_LABEL)."""
    ordinal = str(((pod.get("metadata") or {}).get("labels") or {}).get(INDEX_LABEL, ""))
    if not ordinal.isdigit() or int(ordinal) == 0:
        return env
    moved = {name: str(int(env[name]) + int(ordinal)) for name in PORT_ENV
             if env.get(name, "").isdigit() and int(env[name])}
    return {**env, **moved}
