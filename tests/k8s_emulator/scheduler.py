"""The test cluster's scheduler loop step: binds an unassigned pod to a node that passes kube-scheduler's filters
(scheduling.py), round robin over the kubelet's nodes that score highest for its preferred pod (anti-)affinity, or
reports it Pending with PodScheduled=False -- reason `SchedulingGated` while it has scheduling gates, else
`Unschedulable` with the scheduler's message and a FailedScheduling event -- again whenever the reason changes.
The kubelet retries unscheduled pods on heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

from tests.k8s_emulator import scheduling
from tests.k8s_emulator.clock import now_rfc3339
from tests.k8s_emulator.httpclient import ApiStatusError, KubeHttpClient, resource_path

PostEvent = Callable[..., Awaitable[None]]  # (pod, reason, message, component=..., kind=...)
GATED = "Scheduling is blocked due to non-empty scheduling gates"


class PodScheduler:
    def __init__(self, api: KubeHttpClient, node_names: list[str], lost: set[str], post_event: PostEvent) -> None:
        self.api, self.node_names, self.lost, self.post_event = api, node_names, lost, post_event
        self.unscheduled: dict[str, str] = {}  # pods no node could take, and why
        self._round_robin = itertools.cycle(node_names)

    def forget_all_but(self, uids: set[str]) -> None:
        self.unscheduled = {uid: why for uid, why in self.unscheduled.items() if uid in uids}

    async def _pending(self, pod: dict[str, Any], reason: str, why: str) -> bool:
        """Report the pod Pending for `why`, once per distinct reason; True when it was news."""
        meta = pod["metadata"]
        if self.unscheduled.get(meta["uid"]) == why:
            return False
        self.unscheduled[meta["uid"]] = why
        condition = {"type": "PodScheduled", "status": "False", "reason": reason, "lastTransitionTime": now_rfc3339(),
                     "message": why}
        with contextlib.suppress(ApiStatusError, OSError, asyncio.TimeoutError):
            await self.api.merge_patch(resource_path("pods", meta["namespace"], meta["name"], "status"),
                                       {"status": {"phase": "Pending", "conditions": [condition]}})
        return True

    async def pick_node(self, pod: dict[str, Any]) -> tuple[str | None, str]:
        """Round robin over this kubelet's nodes that pass the scheduler's filters and score highest for the pod's
        preferred pod (anti-)affinity (scheduling.py); when none passes, (None, the scheduler's message)."""
        nodes = (await self.api.request("GET", resource_path("nodes")))["items"]
        pods = (await self.api.request("GET", resource_path("pods")))["items"]
        namespaces = (await self.api.request("GET", resource_path("namespaces")))["items"]
        around = scheduling.Neighbours.of(pods, nodes, namespaces)
        ours = [n for n in nodes if n["metadata"]["name"] in self.node_names]
        fit, misfits = scheduling.feasible_nodes(pod, ours, pods, self.lost, around)
        best = scheduling.best_scored(pod, fit, around)
        for _ in self.node_names:
            node = next(self._round_robin)
            if node in best:
                return node, ""
        return None, scheduling.unschedulable_message(misfits)

    async def schedule(self, pod: dict[str, Any]) -> None:
        """Bind the pod to a node, or report why it stays Pending."""
        meta = pod["metadata"]
        if (pod.get("spec") or {}).get("schedulingGates"):
            await self._pending(pod, "SchedulingGated", GATED)
            return
        chosen, why = await self.pick_node(pod)
        if chosen is None:
            if await self._pending(pod, "Unschedulable", why):
                await self.post_event(pod, "FailedScheduling", why, component="default-scheduler", kind="Warning")
            return
        self.unscheduled.pop(meta["uid"], None)
        await self.api.merge_patch(resource_path("pods", meta["namespace"], meta["name"]),
                                   {"spec": {"nodeName": chosen}})
        await self.post_event(pod, "Scheduled", f"Successfully assigned {meta['namespace']}/{meta['name']} "
                              f"to {chosen}", component="default-scheduler")
