"""The findings inbox of one job: where the health monitor leaves what it found for the job's reconcile pass.

The reconcile pass is the only writer of a TrainingJob's status. The monitor does not patch conditions: it reports a
hang or a straggler verdict here (in process) and wakes the job's runner; the next pass reads a `snapshot()` as
observed input (policy/observed.py) and decides the conditions, the events and any restart. A hang report is
consumed by the pass that saw it (`consumed`, after its status write succeeded); a straggler verdict stays until
the monitor changes it, and is ignored once the job restarted since.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

from flywheel.policy.observed import HangReport, HealthFindings, StragglerReport


class FindingsInbox:
    def __init__(self, wake: Callable[[], None] | None = None) -> None:
        """`wake`: runs the job's next pass now (the runner's poke)."""
        self._wake = wake
        self._lock = threading.Lock()
        self._findings = HealthFindings()

    def report_hang(self, message: str, generation: int, stepped: bool = False) -> None:
        """No step progress while the job had `generation` restarts: the pass restarts it (FailureKind.HANG).
        `stepped`: that generation trained a step before it stopped (False when the finder cannot tell)."""
        with self._lock:
            self._findings = replace(self._findings, hang=HangReport(message, generation, stepped))
        self._poke()

    def report_straggler(self, degraded: bool, message: str, generation: int) -> None:
        with self._lock:
            self._findings = replace(self._findings, straggler=StragglerReport(degraded, message, generation))
        self._poke()

    def report_node_fault(self, node: str, message: str) -> None:
        """A fatal GPU XID on `node`, which runs workers of this Running job: the pass drains it ahead (a memory
        checkpoint, then the move) instead of the monitor deleting the pods at once."""
        with self._lock:
            faults = tuple(f for f in self._findings.node_faults if f[0] != node) + ((node, message),)
            self._findings = replace(self._findings, node_faults=faults)
        self._poke()

    def snapshot(self) -> HealthFindings:
        with self._lock:
            return self._findings

    def consumed(self, seen: HealthFindings) -> None:
        """The pass that read `seen` wrote its status: its hang report was acted on (or was stale), drop it unless
        a newer one arrived meanwhile."""
        with self._lock:
            if seen.hang is not None and self._findings.hang is seen.hang:
                self._findings = replace(self._findings, hang=None)
            if seen.node_faults:  # the pass that read them started the drain (status.drain keeps it)
                left = tuple(f for f in self._findings.node_faults if f not in seen.node_faults)
                self._findings = replace(self._findings, node_faults=left)

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake()
