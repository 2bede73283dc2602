"""What the health monitor needs from its executor (the operator implements both protocols).

The monitor decides nothing about budgets or status: it reports findings. The executor hands hangs and straggler
verdicts to the job's reconcile pass (monitor/findings.py), which alone writes the job's status: its conditions,
events and the restart (`policy.decide_restart(spec, FailureKind.HANG, ...)`). Node faults act on pods and nodes.
Every method may raise; the monitor logs and meters the failure and goes on (a hang whose hand-over failed is
reported again at the next evaluation).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from flywheel.policy.health_checks import Degradation, HangFinding, WatchedJob
from flywheel.policy.xid import NodeFault, RankRestart, WatchedPod


class JobInventory(Protocol):
    async def jobs(self) -> Sequence[WatchedJob]:
        """The TrainingJobs to watch with their pods (node, phase, replica index, when they began Running)."""
        ...


class HealthActions(Protocol):
    async def mark_hung(self, finding: HangFinding) -> None:
        """Request stack dumps (the trainer's dump pipe, see trainer/distributed/collective_env.py), then report the
        hang to the job's reconcile pass, which restarts it by policy. Called once per hang episode."""
        ...

    async def cordon_node(self, node: str, fault: NodeFault) -> None:
        """Mark `node` unschedulable (only called when cordoning is enabled), with an event naming the XIDs."""
        ...

    async def replace_pods(self, pods: Sequence[WatchedPod], fault: NodeFault) -> None:
        """Delete these pods of one job so replacements are scheduled elsewhere (after cordon_node, if any)."""
        ...

    async def restart_ranks(self, restart: RankRestart) -> None:
        """Restart the ranks in these pods (app-level XID); the node stays in service."""
        ...

    async def mark_degraded(self, change: Degradation) -> None:
        """Report the straggler verdict (degraded or recovered) to the job's reconcile pass, which sets `Degraded`."""
        ...


class XidMemory(Protocol):
    """Where fatal-XID actions are remembered across operator restarts (policy/xid_memory.py: node annotations)."""

    async def handled(self, nodes: Sequence[str]) -> dict[str, dict[str, int]]:
        """node -> gpu -> the fatal code already acted on, for these nodes (a node that is gone: none)."""
        ...

    async def remember(self, fault: NodeFault) -> None:
        """Record that `fault` was acted on (merged with what its node remembers)."""
        ...
