"""The health monitor's fatal-XID memory on the Kubernetes side: the node annotation `flywheel.dev/xid-handled`
(monitor/executor_api.py `XidMemory`; the decisions are policy/xid_memory.py's).

Nodes are listed (the operator's node permission is `list`, and `patch` with the health monitor on), only when a
fatal XID appears that this process has no memory of: rare, and never in a steady state."""

from __future__ import annotations

from collections.abc import Sequence

from flywheel.contracts.labels import XID_HANDLED_ANNOTATION
from flywheel.kube.client import Kube
from flywheel.policy.xid import NodeFault
from flywheel.policy.xid_memory import after_fault, format_handled, parse_handled

NODES = "/api/v1/nodes"


class KubeXidMemory:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    async def _memories(self, nodes: Sequence[str]) -> dict[str, dict[str, int]]:
        """node -> its remembered gpu -> code, for those of `nodes` that exist."""
        wanted = set(nodes)
        return {obj["metadata"]["name"]: parse_handled((obj["metadata"].get("annotations") or {}).get(
            XID_HANDLED_ANNOTATION)) for obj in await self.kube.list(NODES) if obj["metadata"]["name"] in wanted}

    async def handled(self, nodes: Sequence[str]) -> dict[str, dict[str, int]]:
        return {node: gpus for node, gpus in (await self._memories(nodes)).items() if gpus}

    async def remember(self, fault: NodeFault) -> None:
        was = (await self._memories([fault.node])).get(fault.node)
        if was is None:  # the node is gone: nothing to act on again
            return
        await self.kube.merge_patch(f"{NODES}/{fault.node}", {"metadata": {"annotations": {
            XID_HANDLED_ANNOTATION: format_handled(after_fault(was, fault))}}})
