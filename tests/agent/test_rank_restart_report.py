"""`flywheel launch`'s agent reports a restart of its ranks only when it follows a failure, not a membership change
(another worker joined or restarted, or every rank stopped after an agreed checkpoint), with the first failed rank's
exit as the reason."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.distributed.elastic.agent.server.api import WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

from flywheel.agent import drain_hold, rank_restarts
from flywheel.agent import events as agent_events
from flywheel.agent.agent import FlywheelAgent
from flywheel.agent.hooks import AgentHooks
from flywheel.contracts import exitcodes, termination_log
from flywheel.eventlog import read_records


def worker_group(**fields: object) -> SimpleNamespace:
    """A stand-in for torch's WorkerGroup: the fields the agent reads (its rendezvous round's store address)."""
    return SimpleNamespace(master_addr="127.0.0.1", master_port=29500, **fields)


def test_only_restarts_after_a_failure_are_reported(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.setattr(LocalElasticAgent, "_restart_workers", lambda self, group: None)  # torch's own restart
    # Only this test's reporter: handlers that earlier tests in this process created keep theirs (an etcd liveness
    # key each, its etcd long gone: every report would wait out its RPC timeout).
    monkeypatch.setattr(rank_restarts, "reporters", AgentHooks("reporter"))
    monkeypatch.setattr(drain_hold, "sources", AgentHooks("reader"))  # the same for the drain requests they would read
    agent = object.__new__(FlywheelAgent)
    agent.events = agent_events.AgentEvents({"FLYWHEEL_EVENTS_FILE": str(tmp_path / "events.jsonl")})
    reports: list[tuple[int, str]] = []

    def reporter(count: int, reason: str, at: float) -> None:
        reports.append((count, reason))

    rank_restarts.reporters.add(reporter)
    try:
        group = worker_group(state=WorkerState.HEALTHY, workers=[])
        agent._restart_workers(group)  # a membership change: not an interruption of this worker
        assert reports == []
        agent.last_failures = {0: (-15, 101.0), 1: (-9, 100.0)}  # rank 1 killed, rank 0 stopped after it
        group.state = WorkerState.FAILED
        agent._restart_workers(group)
        agent.last_failures = {0: (5, 200.0)}
        agent._restart_workers(group)
        # Every rank stopped after an agreed emergency checkpoint (a peer scaled down, suspended, deleted): the
        # group changes, nothing here failed. One rank stopped and one killed is a failure again.
        agent.last_failures = {0: (exitcodes.STOPPED, 300.0), 1: (exitcodes.STOPPED, 300.1)}
        agent._restart_workers(group)
        agent.last_failures = {0: (exitcodes.STOPPED, 400.1), 1: (-9, 400.0)}
        agent._restart_workers(group)
    finally:
        rank_restarts.reporters.remove(reporter)
    assert reports == [(1, "rank 1: killed by SIGKILL"), (2, "rank 0: exit code 5 (collective-timeout)"),
                       (3, "rank 1: killed by SIGKILL")]
    # The event log has each failed rank of each restart after a failure (not the ranks stopped after it).
    exits = [(r.rank, r.exit_code, r.group) for r in read_records(tmp_path / "events.jsonl")]
    assert exits == [(1, 137, "127.0.0.1:29500"), (0, 5, "127.0.0.1:29500"), (1, 137, "127.0.0.1:29500")]


def test_a_drain_may_hold_the_restart_only_of_ranks_stopped_for_it_or_still_running(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """drain_hold is asked before ranks stopped by a checkpoint request (STOPPED) or still running (a peer's new
    round) start again; never before the restart of crashed ranks: those have not answered, their restart will."""
    monkeypatch.setattr(LocalElasticAgent, "_restart_workers", lambda self, group: None)
    monkeypatch.setattr(rank_restarts, "reporters", AgentHooks("reporter"))
    asked: list[list[int]] = []
    monkeypatch.setattr(drain_hold, "hold_while_moving", lambda ranks: asked.append(list(ranks)) or 0.0)
    agent = object.__new__(FlywheelAgent)
    workers = [SimpleNamespace(global_rank=2), SimpleNamespace(global_rank=3)]
    agent._restart_workers(worker_group(state=WorkerState.HEALTHY, workers=workers))
    agent.last_failures = {2: (exitcodes.STOPPED, 10.0), 3: (exitcodes.STOPPED, 10.1)}
    agent._restart_workers(worker_group(state=WorkerState.FAILED, workers=workers))
    assert asked == [[2, 3], [2, 3]]
    agent.last_failures = {2: (exitcodes.STOPPED, 10.0), 3: (-9, 10.1)}  # one of them killed
    agent._restart_workers(worker_group(state=WorkerState.FAILED, workers=workers))
    agent.last_failures = {2: (1, 20.0)}
    agent._restart_workers(worker_group(state=WorkerState.FAILED, workers=workers))
    assert len(asked) == 2


def test_a_restart_in_place_empties_the_termination_message_and_a_final_stop_keeps_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A rank crash the agent restarts in place is recovered from: the message the pod fails with later must be
    that later failure's, not the first reason written in the pod's lifetime."""
    message = tmp_path / "termination-log"
    monkeypatch.setenv(termination_log.ENV, str(message))
    monkeypatch.setattr(rank_restarts, "reporters", AgentHooks("reporter"))
    monkeypatch.setattr(drain_hold, "sources", AgentHooks("reader"))
    agent = object.__new__(FlywheelAgent)
    monkeypatch.setattr(agent, "_stop_ranks", lambda group: None)
    # torch's restart: stop the ranks (ours, above), then start new ones, which fail later with another reason
    monkeypatch.setattr(LocalElasticAgent, "_restart_workers", lambda self, group: self._stop_workers(group))
    termination_log.write_reason("RuntimeError: CUDA error: unspecified launch failure")
    agent.last_failures = {3: (1, 100.0)}
    group = worker_group(state=WorkerState.FAILED, workers=[])
    agent._restart_workers(group)
    assert message.read_text() == ""
    termination_log.write_reason("torch.OutOfMemoryError: CUDA out of memory")
    agent._stop_workers(group)  # no restart left: torch stops the ranks for good
    assert message.read_text() == "torch.OutOfMemoryError: CUDA out of memory"


def test_ranks_stopped_for_a_peers_move_restart_in_place_without_spending_a_crash_restart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank exited STOPPED (a checkpoint agreed because a peer was drained, scaled down, evicted): the agent
    gets the restart torch takes for it, so PET_MAX_RESTARTS = 0 still restarts the ranks in place; a crash, or
    ranks stopped beside a crashed one, spends one as before."""
    agent = object.__new__(FlywheelAgent)
    agent._remaining_restarts = 0
    monkeypatch.setattr(agent, "_count_startup_crash", lambda: None)

    def monitored(*codes: int) -> None:
        failures = {rank: SimpleNamespace(exitcode=code, timestamp=1.0) for rank, code in enumerate(codes)}
        result = SimpleNamespace(is_failed=lambda: True, failures=failures)
        monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", lambda self, group: result)
        agent._monitor_workers(SimpleNamespace())

    monitored(exitcodes.STOPPED, exitcodes.STOPPED)
    assert agent._remaining_restarts == 1  # torch's loop takes it for this restart
    agent._remaining_restarts = 0
    monitored(exitcodes.STOPPED, -9)
    monitored(1)
    assert agent._remaining_restarts == 0
