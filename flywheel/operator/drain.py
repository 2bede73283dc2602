"""Drain ahead, the operator's side (policy/drain.py decides): which nodes of the job are leaving, and the etcd
checkpoint request with the ranks' answers.

- Nodes: the operator's node index (caches.py) keeps, beside the lost nodes, every node that is cordoned or has a
  NoSchedule/NoExecute taint: (name, unschedulable, taint keys). `node_marks` keeps the taints whose key is in
  --drain-taint-keys; a fatal XID the health monitor found on a node (its findings) marks it too.
- etcd: `DrainFollower` follows /flywheel/requests/<run_id>/ (flywheel/etcd/requests.py) for the open request and
  the ranks' answers, sends a request once per id, and deletes the prefix when the drain ends.

The default taint keys are the ones the usual node health and maintenance controllers set before a node goes
(docs/operator.md, "Drain ahead", says where each comes from).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flywheel.etcd import requests as etcd_requests
from flywheel.policy.decisions import ClearCheckpointRequest, RequestCheckpoint
from flywheel.policy.drain import CORDON_TAINT, DrainInput, NodeMarks

DEFAULT_DRAIN_TAINT_KEYS = (
    CORDON_TAINT,  # kubectl cordon / drain (the node lifecycle controller's taint)
    "nvidia.com/gpu-xid-error",  # NVSentinel fault-quarantine's taint for fatal GPU XIDs (its example rule set)
    "aws-node-termination-handler/scheduled-maintenance",  # AWS NTH (taintNode: true): EC2 scheduled maintenance
    "aws-node-termination-handler/spot-itn",  # AWS NTH: spot interruption notice
    "aws-node-termination-handler/asg-lifecycle-termination",  # AWS NTH: the ASG is terminating the instance
    "aws-node-termination-handler/rebalance-recommendation",  # AWS NTH: EC2 rebalance recommendation
    "cloud.google.com/impending-node-termination",  # GKE: host maintenance / node termination ahead
    "karpenter.sh/disrupted",  # Karpenter: the node is being disrupted (consolidation, drift, expiry)
    "ToBeDeletedByClusterAutoscaler",  # Cluster Autoscaler: the node is being scaled down
)
DRAIN_EFFECTS = ("NoSchedule", "NoExecute")

NodeEntry = tuple[str, bool, tuple[str, ...]]  # (name, unschedulable, keys of its NoSchedule/NoExecute taints)


def node_entry(body: Mapping[str, Any]) -> NodeEntry | None:
    """What the node index keeps of a node about leaving (slim); None for a schedulable node without such taints."""
    spec = body.get("spec") or {}
    taints = tuple(sorted({str(t.get("key")) for t in spec.get("taints") or []
                           if t.get("effect") in DRAIN_EFFECTS and t.get("key")}))
    unschedulable = bool(spec.get("unschedulable"))
    if not unschedulable and not taints:
        return None
    return str(body["metadata"]["name"]), unschedulable, taints


def node_marks(entries: Iterable[NodeEntry], taint_keys: Iterable[str],
               fatal_xids: Mapping[str, str] | None = None) -> dict[str, NodeMarks]:
    """The nodes that are leaving for drain ahead: cordoned, a taint in `taint_keys`, or a fatal XID (by node)."""
    wanted = set(taint_keys)
    out: dict[str, NodeMarks] = {}
    for name, unschedulable, taints in entries:
        keys = tuple(k for k in taints if k in wanted)
        if unschedulable or keys:
            out[name] = NodeMarks(unschedulable=unschedulable, taints=keys)
    for name, message in (fatal_xids or {}).items():
        was = out.get(name, NodeMarks())
        out[name] = NodeMarks(unschedulable=was.unschedulable, taints=was.taints, fatal_xid=message)
    return out


class DrainFollower:
    """One job's checkpoint request and answers in etcd; `poke` wakes the job's runner on a change."""

    def __init__(self, poke: Callable[[], None], logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        self.poke, self.logger = poke, logger
        self.state = etcd_requests.RequestState(None, {})
        self.watch: Any = None
        self.sent = ""  # the request id this process wrote

    def start(self, session: Any, run_id: str) -> None:
        if self.watch is not None:
            return
        loop = asyncio.get_running_loop()

        def changed(state: etcd_requests.RequestState) -> None:
            def apply() -> None:
                if state != self.state:
                    self.state = state
                    self.poke()
            loop.call_soon_threadsafe(apply)

        self.watch = etcd_requests.watch_requests(session, run_id, changed, shared=True)

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()
            self.watch = None

    def observe(self, marks: Mapping[str, NodeMarks]) -> DrainInput:
        request = self.state.request
        return DrainInput(nodes=dict(marks), request_id=request.id if request is not None else "",
                          answers={r: (d.id, d.step) for r, d in self.state.done.items()})

    async def act(self, session: Any, run_id: str, action: RequestCheckpoint | ClearCheckpointRequest) -> None:
        """Write the request (once per id: the policy repeats it on every waiting pass), or delete the prefix."""
        loop = asyncio.get_running_loop()
        if isinstance(action, RequestCheckpoint):
            if action.request_id == self.sent:
                return
            request = etcd_requests.CheckpointRequest(action.request_id, action.reason, action.moving)
            await loop.run_in_executor(None, lambda: session.run(etcd_requests.put_request(session, run_id, request)))
            self.sent = action.request_id
            self.logger.info(f"drain ahead: checkpoint request {action.request_id} sent ({action.reason})")
            return
        await loop.run_in_executor(None, lambda: session.run(etcd_requests.clear_requests(session, run_id)))
        self.state = etcd_requests.RequestState(None, {})
        self.sent = ""
