"""The local executor: one process group per worker, the rendezvous store, fault injection, restart decisions.

Decisions come from `flywheel.policy` (pure); this module only carries them out. Worker processes are
`flywheel launch` (torch's elastic agent), each in its own session, with output in <out>/logs/worker-<i>.log.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import IO, assert_never

from rich.markup import escape

from flywheel.contracts import exitcodes, termination_log
from flywheel.contracts.memory_root import forget, worker_memory_root
from flywheel.eventlog import EventLog, EventName
from flywheel.local import procs
from flywheel.local.fault_flags import LoseWorker, RankFault, next_due
from flywheel.local.progress_bar import ProgressView
from flywheel.local.run_record import EventTail, RunRecord
from flywheel.local.spare_pool import SparePool
from flywheel.policy import Action, Recovery, RestartBudget, classify_exit, decide_restart, recovery
from flywheel.policy.finish import finished_message, lingering_stop_at
from flywheel.policy.startup_failure import StartupFailures, after_failure, group_before_first_step
from flywheel.spec import TrainingJobSpec
from flywheel.worker_plan import WorkerPlan

POLL_INTERVAL_S = 0.2
SHUTDOWN_GRACE_S = 30.0  # Ctrl-C/failure: SIGTERM, then SIGKILL after this (agents give ranks 20 s)
JOB_RESTART_GRACE_S = 10.0  # stopping survivors before a job restart: they only need to save an emergency checkpoint


class Outcome(str, Enum):
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INTERRUPTED = "Interrupted"


@dataclass
class WorkerProcess:
    plan: WorkerPlan
    popen: subprocess.Popen[bytes]
    log: IO[bytes]
    stopping: bool = False  # the supervisor asked it to stop: its exit is expected, not a failure
    lost: bool = False  # killed by an injected lose-worker fault

    @property
    def pid(self) -> int:
        return self.popen.pid


@dataclass
class _Stop:
    reason: Outcome | None = None  # set when the whole run is ending
    kill_at: float | None = None  # SIGKILL whatever still runs at this monotonic time
    interrupts: int = 0
    restart_job_after: bool = False  # all workers are being stopped for a RESTART_JOB decision
    message: str = ""


class Supervisor:
    """Runs the planned workers to completion, recreating failed ones as policy decides."""

    def __init__(self, spec: TrainingJobSpec, plans: list[WorkerPlan], events_file: Path, logs_dir: Path,
                 record: RunRecord, progress: ProgressView, faults: list[LoseWorker | RankFault], spares: int = 0,
                 expire_agent: Callable[[str, int], object] | None = None):
        self.spec, self.plans = spec, {p.index: p for p in plans}
        self.events, self.logs_dir = EventTail(events_file), logs_dir
        self.exits = EventLog(events_file)  # worker exits go into the event log beside the ranks' records
        self.record, self.progress = record, progress
        self.pending_faults = list(faults)
        self.fault_fired_at: float | None = None  # the newest injected fault's wall time
        self.workers: dict[int, WorkerProcess] = {}
        self.succeeded: set[int] = set()
        self.budget = RestartBudget()
        self.startup = StartupFailures()  # the same crash before the first step twice fails the run
        self.stop = _Stop()
        self.outcome: Outcome | None = None
        self.message = ""
        self._signals: list[int] = []
        self.generation = 0  # job restarts so far; each gets a fresh rendezvous run id
        self.expire_agent = expire_agent  # (rendezvous run id, agent pid): drop a dead agent from the rendezvous
        self.spares = SparePool(spares, logs_dir.parent / "spares", self._start_process, progress.notice)

    # --- processes -----------------------------------------------------------------------------------------------
    def _worker_env(self, plan: WorkerPlan) -> dict[str, str]:
        """What worker `plan.index` is started with now, on top of the supervisor's own env."""
        said = self._termination_log(plan.index)
        said.write_bytes(b"")  # one start, one reason (as a container's termination message file)
        env = {**plan.env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", termination_log.ENV: str(said)}
        env["PET_RDZV_ID"] = self._rdzv_id(plan)
        return env

    def _rdzv_id(self, plan: WorkerPlan) -> str:
        # After a job restart every worker is new: a fresh run id forms the group at once instead of waiting for the
        # old participants' heartbeats to expire.
        return f"{plan.env['PET_RDZV_ID']}-g{self.generation}" if self.generation else plan.env["PET_RDZV_ID"]

    def _forget_in_rendezvous(self, w: WorkerProcess) -> None:
        """A worker's agent died: its heartbeat is expired now, so the survivors' next round and its replacement
        do not wait the ~6 s torch takes to notice (agent/rendezvous/expiry.py)."""
        if self.expire_agent is None:
            return
        try:
            self.expire_agent(self._rdzv_id(w.plan), w.pid)
        except Exception as err:  # noqa: BLE001 - the heartbeat then expires by itself
            self.progress.notice(f"[yellow]could not expire worker {w.plan.index}'s rendezvous entry: {err}[/]")

    def _start_process(self, env: Mapping[str, str], log_name: str) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
        log = open(self.logs_dir / log_name, "ab")
        argv = list(next(iter(self.plans.values())).argv)  # every worker and spare runs the same command
        popen = subprocess.Popen(argv, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        return popen, log

    def _start(self, plan: WorkerPlan) -> None:
        popen, log = self._start_process(self._worker_env(plan), f"worker-{plan.index}.log")
        self.workers[plan.index] = WorkerProcess(plan=plan, popen=popen, log=log)

    def _replace(self, plan: WorkerPlan) -> str:
        """Start worker `plan.index` again: a warm spare promoted to it when one runs (spare_pool.py), else a cold
        process. Returns the spare's name, or "" for a cold start."""
        env = self._worker_env(plan)
        spare = self.spares.promote(plan.index, env)
        if spare is None:
            self._start(plan)
            return ""
        self.workers[plan.index] = WorkerProcess(plan=plan, popen=spare.popen, log=spare.log)
        with open(self.logs_dir / f"worker-{plan.index}.log", "ab") as log:
            log.write(f"\n--- worker {plan.index} continues as {spare.spare_id} (logs/{spare.spare_id}.log)\n".encode())
        self.progress.notice(f"[green]{spare.spare_id} promoted to worker {plan.index}[/]")
        self.spares.fill(self._spare_template_env())
        return spare.spare_id

    def _termination_log(self, index: int) -> Path:
        return self.logs_dir / f"worker-{index}.termination-log"

    def _exit_reason(self, index: int) -> str:
        """Why worker `index` exited, in its own words: what it wrote to its termination log, else the event log's
        failure reason (a rank's user error)."""
        try:
            lines = self._termination_log(index).read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        said = next((line.strip() for line in reversed(lines) if line.strip()), "")
        return said or self.record.log.failure_reason

    def kill_everything(self) -> None:
        """SIGKILL every worker tree and orphan; safe to call twice (also registered with atexit)."""
        self.spares.stop()
        for w in list(self.workers.values()):
            procs.kill_tree(w.pid)
        for w in list(self.workers.values()):
            try:
                w.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            w.log.close()
        self.workers.clear()
        deadline = time.monotonic() + 2.0
        while procs.reap_orphans(()) and time.monotonic() < deadline:
            time.sleep(0.05)  # ranks die by PDEATHSIG slightly after their agent; catch their own children too

    def _stop_all(self, reason: Outcome | None, grace: float, message: str = "") -> None:
        for w in self.workers.values():
            if not w.stopping:
                w.stopping = True
                procs.signal_quietly(w.pid, signal.SIGTERM, group=True)
        deadline = time.monotonic() + grace
        self.stop.kill_at = deadline if self.stop.kill_at is None else min(self.stop.kill_at, deadline)
        if reason is not None and self.stop.reason is None:
            self.stop.reason, self.stop.message = reason, message

    # --- signals -------------------------------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signals.append(signum)  # acted on by the loop, never inside the handler

    def _handle_interrupts(self) -> None:
        while self._signals:
            signum = self._signals.pop(0)
            self.stop.interrupts += 1
            if self.stop.interrupts == 1:
                self.progress.notice(f"[yellow]{signal.Signals(signum).name}: stopping workers (they take an "
                                     "emergency checkpoint); interrupt again to kill them now[/]")
                self.stop.restart_job_after = False
                self._stop_all(Outcome.INTERRUPTED, SHUTDOWN_GRACE_S, "interrupted")
            else:
                self.stop.kill_at = time.monotonic()

    # --- the loop ------------------------------------------------------------------------------------------------
    def run(self) -> Outcome:
        procs.become_subreaper()
        atexit.register(self.kill_everything)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for plan in self.plans.values():
                self._start(plan)
            self.spares.fill(self._spare_template_env())
            while self.outcome is None:
                self._tick()
                time.sleep(POLL_INTERVAL_S)
            self._drain_events()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self.kill_everything()
            atexit.unregister(self.kill_everything)
            self.exits.close()
        return self.outcome

    def _drain_events(self) -> None:
        told = len(self.record.log.checkpoint_notices)
        for ev in self.events.read_new():
            self.record.add_event(ev)
        for notice in self.record.log.checkpoint_notices[told:]:  # a failing save once per cause; a damaged one
            self.progress.notice(f"[yellow]{escape(notice.words)}[/]")

    def _tick(self) -> None:
        self._handle_interrupts()
        self._drain_events()
        self._inject_faults()
        for index, w in list(self.workers.items()):
            code = w.popen.poll()
            if code is not None:
                self._on_exit(index, w, code)
        self._stop_lingering()
        if self.stop.reason is None:
            self.spares.reap(self._spare_template_env())
        procs.reap_orphans([*(w.pid for w in self.workers.values()), *self.spares.pids()])
        if self.stop.kill_at is not None and time.monotonic() >= self.stop.kill_at:
            for w in self.workers.values():
                procs.kill_tree(w.pid)
        self._maybe_finish()
        self.progress.update(self.record)

    def _stop_lingering(self) -> None:
        """The operator's rule (policy.finish): workers still running finishGraceSeconds after the done report are
        stopped, and the job Succeeded."""
        stop_at = lingering_stop_at(self.record.done.time if self.record.done else None,
                                    self.spec.fault_tolerance.finish_grace_seconds)
        lingering = sorted(i for i, w in self.workers.items() if not w.stopping)
        if stop_at is None or time.time() < stop_at or not lingering or self.stop.reason is not None:
            return
        message = self._finished_message(lingering)
        self.progress.notice(f"[yellow]{message}[/]")
        self._stop_all(Outcome.SUCCEEDED, SHUTDOWN_GRACE_S, message)

    def _finished_message(self, stopped: list[int]) -> str:
        """The operator's words for a success (policy.finish); a user script reports no done step."""
        done = self.record.done
        return finished_message(done.step if done else None, (done.already_complete_checkpoint or "") if done else "",
                                stopped, self.spec.fault_tolerance.finish_grace_seconds)

    def _inject_faults(self) -> None:
        log = self.record.log
        fault = next_due(self.pending_faults, log.last_step, self.fault_fired_at,
                         log.starts[-1].time if log.starts else None, log.attempt_stepped)
        if fault is None:
            return
        fired = self._rank_fault(fault) if isinstance(fault, RankFault) else self._lose_worker(fault)
        if fired:
            self.pending_faults.remove(fault)
            self.fault_fired_at = time.time()

    def _lose_worker(self, fault: LoseWorker) -> bool:
        w = self.workers.get(fault.replica)
        if w is None or w.stopping:
            return False
        w.lost = True
        procs.kill_tree(w.pid)
        forget(worker_memory_root(w.plan.env))  # a lost host takes its memory-tier copies with it
        self.progress.notice(f"[red]fault {fault.id}: killed worker {fault.replica} "
                             f"(process tree) at step {self.record.last_step}[/]")
        return True

    def _rank_fault(self, fault: RankFault) -> bool:
        """A user's command's rank killed (stopped) from outside: its agent sees it die as it would see the OOM
        killer's SIGKILL."""
        below = [pid for w in self.workers.values() if not w.stopping for pid in procs.descendants(w.pid)]
        ranks = procs.rank_processes(below, fault.rank)
        if not ranks:
            return False  # between groups: the next poll finds the restarted rank
        sig = signal.SIGSTOP if fault.kind == "hang" else signal.SIGKILL
        for pid in ranks:
            procs.signal_quietly(pid, sig)
        self.progress.notice(f"[red]fault {fault.id}: {sig.name} to rank {fault.rank} at step "
                             f"{self.record.last_step}[/]")
        return True

    def _on_exit(self, index: int, w: WorkerProcess, code: int) -> None:
        del self.workers[index]
        procs.kill_tree(w.pid)  # whatever its ranks left behind
        w.log.close()
        if w.stopping:
            return
        if code == exitcodes.SUCCESS:
            self.succeeded.add(index)
            return
        self._forget_in_rendezvous(w)
        kind = classify_exit(code)
        assert kind is not None
        reason = "" if w.lost else self._exit_reason(index)
        detail = "injected lose-worker" if w.lost else f"exit {code} ({exitcodes.describe(code)})"
        detail += f": {reason}" if reason else ""
        self.exits.emit(EventName.WORKER_EXIT, replica=index, exit_code=code, kind=kind.value, detail=detail)
        if self.stop.reason is not None:
            return
        if self.succeeded or self.record.done is not None:
            self.progress.notice(f"[yellow]worker {index} failed ({kind.value}) after training finished[/]")
            return
        self.startup = after_failure(self.startup, kind, reason, self.record.log.current_step,
                                     self._before_first_step())
        said = f": {escape(reason)}" if reason else ""  # worker output may hold [brackets]
        if self.startup.deterministic:
            self.progress.notice(f"[red]worker {index} exited {code} ({kind.value}){said}[/] -> Fail: "
                                 f"{escape(self.startup.message)}")
            self._carry_out(index, Action.FAIL, self.startup.label, self.startup.message)
            return
        live = sum(1 for x in self.workers.values() if not x.stopping)
        decision = decide_restart(self.spec, kind, self.budget, self.record.committed_step, live,
                                  self.spares.ready_count())
        self.budget = decision.budget
        self.progress.notice(f"[red]worker {index} exited {code} ({kind.value}){said}[/] -> "
                             f"{decision.action.value}: {escape(decision.message)}")
        self._carry_out(index, decision.action, decision.reason, decision.message)

    def _before_first_step(self) -> bool | None:
        """Whether the workers' group since the last recreation failed before its first step (the operator's rule):
        from the newest `start` in the log and whether a step followed it."""
        log, recreations = self.record.log, self.record.recreations
        last = log.last
        restarted = recreations[-1].time if recreations else None
        if log.attempt:
            return group_before_first_step(log.attempt, log.attempt_stepped, restarted)
        if last is not None and (restarted is None or last.time >= restarted):  # a user script: steps only
            return group_before_first_step(last.time, True, restarted)
        return group_before_first_step(0.0, False, restarted)

    def _carry_out(self, index: int, action: Action, reason: str, message: str) -> None:
        """The decision table (policy.recovery) the operator carries out too."""
        match recovery(action):
            case Recovery.REPLACE_FAILED:  # RESTART_WORKER, or SHRINK: the survivors go on, the worker rejoins
                spare = self._replace(self.plans[index])
                self.record.add_recreation(time.time(), (index,), action.value, reason, spare=spare)
            case Recovery.REPLACE_ALL:
                self.stop.restart_job_after = True
                self._stop_all(None, JOB_RESTART_GRACE_S)
            case Recovery.END_JOB:
                self._stop_all(Outcome.FAILED, SHUTDOWN_GRACE_S, message)
            case _:
                assert_never(recovery(action))

    def _spare_template_env(self) -> dict[str, str]:
        plan = next(iter(self.plans.values()))
        return {**plan.env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

    def _maybe_finish(self) -> None:
        if self.workers:
            return
        self.stop.kill_at = None
        if self.stop.reason is not None:
            self.outcome, self.message = self.stop.reason, self.stop.message
        elif self.stop.restart_job_after:
            self.stop.restart_job_after = False
            self.generation += 1
            indices = tuple(self.plans)
            self.record.add_recreation(time.time(), indices, Action.RESTART_JOB.value, "restart")
            for i in indices:
                self._start(self.plans[i])
        elif self.record.done is not None or set(self.plans) <= self.succeeded:
            self.outcome, self.message = Outcome.SUCCEEDED, self._finished_message([])
            if self.record.done is not None and self.record.done.already_complete_checkpoint:
                self.progress.notice(f"[green]{self.message}[/]")
        else:
            self.outcome, self.message = Outcome.FAILED, "workers exited without finishing training"
