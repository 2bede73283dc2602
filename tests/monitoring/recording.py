"""Test doubles for the executor side: a fixed job inventory and actions that record what they were asked."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from flywheel.policy.health_checks import Degradation, HangFinding, WatchedJob
from flywheel.policy.xid import NodeFault, RankRestart, WatchedPod


@dataclass
class StaticInventory:
    views: list[WatchedJob]

    async def jobs(self) -> Sequence[WatchedJob]:
        return self.views


@dataclass
class RecordingActions:
    """Records (monotonic time, action, detail). `fail` names actions that raise, to test error handling."""

    calls: list[tuple[float, str, object]] = field(default_factory=list)
    fail: set[str] = field(default_factory=set)

    def _record(self, action: str, detail: object) -> None:
        self.calls.append((time.monotonic(), action, detail))
        if action in self.fail:
            raise RuntimeError(f"{action} failed (test)")

    def named(self, action: str) -> list[tuple[float, object]]:
        return [(t, d) for t, a, d in self.calls if a == action]

    async def mark_hung(self, finding: HangFinding) -> None:
        self._record("mark_hung", finding)

    async def cordon_node(self, node: str, fault: NodeFault) -> None:
        self._record("cordon_node", node)

    async def replace_pods(self, pods: Sequence[WatchedPod], fault: NodeFault) -> None:
        self._record("replace_pods", tuple(p.name for p in pods))

    async def restart_ranks(self, restart: RankRestart) -> None:
        self._record("restart_ranks", restart.pods)

    async def mark_degraded(self, change: Degradation) -> None:
        self._record("mark_degraded", change)
