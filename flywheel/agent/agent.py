"""The elastic agent `flywheel launch` runs (launch.py imports this module only once it starts the agent: it imports
torch, which launch.py must not load before OMP_NUM_THREADS is set): torch's LocalElasticAgent, with Flywheel's
stopping, restart reporting and restart rules, and the exit code a worker reports for its failed ranks."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

from flywheel import torch_compat
from flywheel.agent import drain_hold, first_step, rank_restarts, restart_requests
from flywheel.agent import events as agent_events
from flywheel.contracts import exitcodes, startup_crashes, termination_log
from flywheel.etcd.rank_restart import RankRestartRequest


def first_failure_exit_code(failures: Mapping[int, tuple[int, float]]) -> int:
    """The code `flywheel launch` exits with, from {global_rank: (exit_code, timestamp)} of failed ranks.

    A USER_ERROR wins (it must not be retried by anyone); otherwise the earliest failure, preferring a rank that
    failed by itself over ranks the agent stopped with SIGTERM afterwards; ties go to the lowest rank.
    Signal deaths (negative Popen codes) become 128+N as a shell reports them.
    """
    if not failures:
        return exitcodes.CRASH
    if any(code == exitcodes.USER_ERROR for code, _ in failures.values()):
        return exitcodes.USER_ERROR
    first_rank = min(failures, key=lambda r: (failures[r][1], agent_events.stopped_by_agent(failures[r][0]), r))
    return exitcodes.shell_code(failures[first_rank][0])


# Seconds a rank gets between SIGTERM and SIGKILL when the agent restarts or stops its ranks after a failure.
RESTART_STOP_GRACE_SECONDS = 2


def stopped_for_a_peer(exits: list[int]) -> bool:
    """Every rank exited STOPPED: they agreed on a checkpoint because a peer was told to stop -- no failure here."""
    return bool(exits) and all(code == exitcodes.STOPPED for code in exits)


class FlywheelAgent(LocalElasticAgent):
    """LocalElasticAgent that does not restart ranks after a permanent user error, and that gives ranks a short
    grace when it stops them after a failure (a peer already failed, so no emergency checkpoint can be taken; a
    SIGSTOPped rank would otherwise hold the restart for torch's 30 s default). A SIGTERM to the agent itself
    (preemption, Ctrl-C) still gives ranks the long grace of `_shutdown` for their emergency checkpoint.
    Each restart of its ranks after a failure is reported (rank_restarts.py), so the operator counts it, and each
    group it starts and each rank that fails goes to the event log (agent/events.py), whatever the ranks run.

    The operator may ask it to restart its ranks in place (restart_requests.py: a hang while every agent is
    alive): the monitor then SIGKILLs them at once (a hung rank can take no checkpoint, a SIGSTOPped one ignores
    SIGTERM) and reports the group unhealthy, so torch restarts it in a new rendezvous round of the same agents
    (rendezvous/regroup.py closes it as soon as all are back). That restart is reported like the others (the
    operator takes it as the recovery it decided) and does not spend the agent's own restart budget
    (PET_MAX_RESTARTS, for crashes of its ranks): the operator spent its own."""

    rank_restarts_done = 0
    last_failures: dict[int, tuple[int, float]] = {}
    restart_request: RankRestartRequest | None = None  # the operator's request this restart serves
    restarting = False  # within _restart_workers (its _stop_workers stops ranks to start them again)
    startup = startup_crashes.StartupCrashes()  # the same crash before the first step twice: not again in place
    events: agent_events.AgentEvents | None = None

    def _events(self) -> agent_events.AgentEvents:
        if self.events is None:
            self.events = agent_events.from_environment()
        return self.events

    @staticmethod
    def _group(worker_group: WorkerGroup) -> str:
        return agent_events.group_name(worker_group.master_addr, worker_group.master_port)

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        first_step.reset(os.environ.get(first_step.ENV, ""))
        started: dict[int, Any] = super()._start_workers(worker_group)
        if any(w.global_rank == 0 for w in worker_group.workers):
            world_size = max((w.world_size for w in worker_group.workers), default=0)
            self._events().started(self._group(worker_group), world_size,
                                   worker_group.spec.max_restarts - self._remaining_restarts)
        # These ranks started after every request seen so far: they serve it (a restart for a crash, or for a
        # peer's new round, that began while the request arrived, must not be followed by a second one).
        self.restart_request = None
        restart_requests.take()
        # When one rank fails, torch's process context closes the others itself (`_poll` -> `close()`) with a
        # 30 s grace, which a SIGSTOPped or collective-blocked rank always uses up. Failure-triggered closes
        # get the short grace; explicit ones (the agent's own shutdown) keep the timeout they ask for.
        pcontext = torch_compat.agent_process_context(self)
        if pcontext is not None:
            close = pcontext.close

            def close_after_failure(death_sig: signal.Signals | None = None,
                                    timeout: int = RESTART_STOP_GRACE_SECONDS) -> None:
                close(death_sig, timeout)

            pcontext.close = close_after_failure  # type: ignore[method-assign]
        return started

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        self._stop_ranks(worker_group)
        # Stopped to restart: their reasons are about a failure (or a membership change) this restart recovers
        # from, and the pod's termination message must say why it fails later. Not when torch stops them for
        # good (no restart left): their reason is the pod's.
        if self.restarting:
            termination_log.clear()

    def _stop_ranks(self, worker_group: WorkerGroup) -> None:
        # A healthy group is stopped for a membership change: give it time to agree on an emergency checkpoint.
        # Not when a member is gone (a lost node: its replacement is what joins): the ranks are blocked in a
        # collective with it, cannot run their SIGTERM handler and would hold the restart for any grace given
        # (until the collective timeout): they are killed at once (what they saved is in the memory tier).
        # Nor when the operator asked for the restart: the ranks are hung.
        if self.restart_request is not None:
            torch_compat.kill_agent_ranks(self)
            return
        if torch_compat.group_lost_a_member(self, worker_group.group_world_size):
            torch_compat.stop_agent_ranks(self, 0)
            return
        failed = worker_group.state in (WorkerState.FAILED, WorkerState.UNHEALTHY)
        torch_compat.stop_agent_ranks(self, RESTART_STOP_GRACE_SECONDS if failed else None)

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        request = restart_requests.take()
        if request is not None:
            logging.getLogger(__name__).warning(
                "the operator asks for a restart of the ranks in place (generation %d: %s): killing them",
                request.generation, request.reason or "no reason given")
            self.restart_request = request
            torch_compat.kill_agent_ranks(self)
            torch_compat.grant_agent_restart(self)  # torch takes it back for this restart
            return RunResult(state=WorkerState.UNHEALTHY)
        result: RunResult = super()._monitor_workers(worker_group)
        if result.is_failed():
            self.last_failures = {r: (f.exitcode, float(f.timestamp)) for r, f in result.failures.items()}
            self._count_startup_crash()
        if result.is_failed() and stopped_for_a_peer([f.exitcode for f in result.failures.values()]):
            # Every rank stopped after a checkpoint agreed with a peer told to stop (drained, scaled down,
            # evicted): a planned membership change, not a crash, so its restart in place is not one of
            # PET_MAX_RESTARTS (faultTolerance.maxRestarts). Taken from them, a job with 0 -- or any job past
            # that many such changes -- saw its staying workers exit 6 and restart whole, from disk.
            torch_compat.grant_agent_restart(self)  # torch takes it back for this restart
        if result.is_failed() and any(f.exitcode == exitcodes.USER_ERROR for f in result.failures.values()):
            logging.getLogger(__name__).error("a rank exited USER_ERROR (%d): not restarting",
                                              exitcodes.USER_ERROR)
            torch_compat.forbid_agent_restarts(self)
        return result

    def _report_failed_ranks(self, worker_group: WorkerGroup) -> None:
        """The failed ranks this restart in place recovers from, to the event log. A failure that ends the worker
        (no restart left, a user error) is its exit's to report (the local supervisor's `worker_exit`, the pod's
        status), with the same reason."""
        failures = self.last_failures
        first = rank_restarts.first_failed_rank(failures, first_failure_exit_code(failures))
        self._events().ranks_failed(self._group(worker_group), failures, first)

    def _exit_barrier(self) -> None:
        torch_compat.wait_exit_barrier(self)  # torch's, but a SIGTERM is handled while it waits

    def _count_startup_crash(self) -> None:
        """Ranks that crash before their first step with the same reason as the last time would only crash
        again: they are not restarted in place; the pod fails with that reason, and the job's restart policy
        (the same rule, over pods) decides."""
        self.startup = startup_crashes.count(
            self.startup, crash=exitcodes.is_crash(first_failure_exit_code(self.last_failures)),
            reason=termination_log.read(), step=0,
            before_first_step=not first_step.stepped(os.environ.get(first_step.ENV, "")))
        if self.startup.deterministic:
            logging.getLogger(__name__).error(
                "the ranks crashed before their first step with the same error %d times in a row (%s): not "
                "restarting them in place", self.startup.attempts, self.startup.reason)
            torch_compat.forbid_agent_restarts(self)

    def _restart_workers(self, worker_group: WorkerGroup) -> None:
        # torch restarts the ranks after a failure (state FAILED/UNHEALTHY) or for a membership change
        # (HEALTHY: another worker joined or restarted); only the first is an interruption of this worker --
        # or the operator's request, which a peer's new round may have brought here before the monitor saw it.
        # Ranks that all exited STOPPED did not fail: they agreed with their peers on an emergency checkpoint
        # because a peer was told to stop (scaled down, suspended, deleted, evicted, drained), a membership
        # change whose cause, where it is an interruption, the operator counts itself.
        # A worker that a drain moves waits for its pod's deletion instead (drain_hold.py): its ranks stopped
        # for the drain's checkpoint (STOPPED), or still run while a peer's new round began.
        exits = [code for code, _ in self.last_failures.values()]
        stopped = worker_group.state is WorkerState.FAILED and stopped_for_a_peer(exits)
        if stopped or worker_group.state is WorkerState.HEALTHY:
            drain_hold.hold_while_moving([w.global_rank for w in worker_group.workers])
        if self.restart_request is None:
            self.restart_request = restart_requests.take()
        request = self.restart_request
        failed = worker_group.state in (WorkerState.FAILED, WorkerState.UNHEALTHY) and not stopped
        if failed or request is not None:
            self.rank_restarts_done += 1
            failures = self.last_failures
            reason = (restart_requests.restart_reason(request) if request is not None
                      else rank_restarts.restart_reason(failures, first_failure_exit_code(failures)))
            logging.getLogger(__name__).warning("restarting the ranks in place (%d so far): %s",
                                                self.rank_restarts_done, reason)
            rank_restarts.report(self.rank_restarts_done, reason)
            if failed:
                self._report_failed_ranks(worker_group)
        elif stopped:
            logging.getLogger(__name__).warning("restarting the ranks in place: they stopped after a checkpoint "
                                                "agreed with a peer told to stop (not a failure: not reported)")
        self.restarting = True
        try:
            super()._restart_workers(worker_group)
        finally:
            self.restarting = False
