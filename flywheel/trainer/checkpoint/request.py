"""Drain ahead, the rank's side: the operator's checkpoint request (etcd, flywheel/etcd/requests.py) -> a checkpoint
at the next step boundary on every rank, an answer, and a stop.

Each rank follows `/flywheel/requests/<run_id>/checkpoint` on a watch (`pending()` only reads memory, so the step
pays nothing). The loop folds `pending()` into its per-step all-reduce (train_loop.py `_step`): a request seen by
any rank stops every rank after the same step. There `stop_for_request` saves that step to the memory tier (own
copy + the peer's replica, taken now even when memoryEverySteps would not; a job without the tier, or a memory save
that is not complete on every rank, saves to disk instead, blocking), answers {id, step} and returns STOPPED: no
step is trained after the checkpoint, so the resumed job replays none. A move that takes some rank's own copy and
its replica both (every worker on the drained node, or a job of one worker) would leave the memory checkpoint
nowhere: that request is saved to disk. The operator moves the worker once every rank answered (policy/drain.py).

A request this rank already answered (its done key holds the id: a rank restarted in place after the stop) is not
pending. Only for runs whose rendezvous is etcd-v3 (the operator's); elsewhere there is no request to follow.
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Collection, Mapping
from typing import Any

import torch.distributed as dist

from flywheel.contracts import exitcodes
from flywheel.etcd import requests as etcd_requests
from flywheel.etcd.session import EtcdSession
from flywheel.trainer.checkpoint.manager import AppState, Checkpointer
from flywheel.trainer.checkpoint.tiers.memory import copies_outlive

log = logging.getLogger(__name__)


class CheckpointRequests:
    """One rank's view of the run's checkpoint request."""

    def __init__(self, session: EtcdSession, run_id: str, rank: int) -> None:
        self.session, self.run_id, self.rank = session, run_id, rank
        self._request: etcd_requests.CheckpointRequest | None = None
        self._answered = ""
        self._watch = etcd_requests.watch_requests(session, run_id, self._changed)

    @classmethod
    def from_environ(cls, rank: int, environ: Mapping[str, str] | None = None) -> CheckpointRequests | None:
        """Following the run's requests when its rendezvous is etcd-v3 (`PET_RDZV_*`, as the operator sets them)."""
        env = os.environ if environ is None else environ
        endpoint, run_id = env.get("PET_RDZV_ENDPOINT", ""), env.get("PET_RDZV_ID", "")
        if env.get("PET_RDZV_BACKEND") != "etcd-v3" or not endpoint or not run_id or "/" in run_id:
            return None
        try:
            session = EtcdSession(endpoint, retry_seconds=5.0, name="flywheel-requests-etcd")
            # The state first, synchronously: a request this rank answered before a restart is never pending.
            state = session.run(etcd_requests.read_state(session, run_id))
        except Exception as err:  # noqa: BLE001 - etcd down: train on; a drain then moves after its bound
            log.warning("checkpoint requests not followed (etcd: %s); a drain ahead will not wait for this rank", err)
            return None
        requests = cls(session, run_id, rank)
        requests._changed(state)
        atexit.register(requests.close)
        return requests

    def _changed(self, state: etcd_requests.RequestState) -> None:
        done = state.done.get(self.rank)
        if done is not None:
            self._answered = done.id
        self._request = state.request

    def pending(self) -> bool:
        """A request this rank has not answered (memory only: called every step)."""
        request = self._request
        return request is not None and request.id != self._answered

    def current(self) -> etcd_requests.CheckpointRequest | None:
        """The open request (read from etcd when this rank has not seen it yet: a peer saw it first)."""
        request = self._request
        if request is None or request.id == self._answered:
            request = self.session.run(etcd_requests.read_state(self.session, self.run_id)).request
        return request

    def moving(self) -> set[str]:
        """The replica ids of the workers the open request moves."""
        request = self.current()
        return {str(i) for i in request.moving} if request is not None else set()

    def answer(self, step: int) -> str:
        """Tell the operator this rank holds the request's checkpoint of `step`; the request's id."""
        request = self.current()
        if request is None:
            log.warning("checkpoint request gone before rank %d answered (the drain ended)", self.rank)
            return ""
        done = etcd_requests.CheckpointDone(self.rank, request.id, step)
        self.session.run(etcd_requests.put_done(self.session, self.run_id, done))
        self._answered = request.id
        return request.id

    def close(self) -> None:
        atexit.unregister(self.close)
        self._watch.stop()
        self.session.close()


def save_now(ckpt: Checkpointer, step: int, app: AppState, *, replica: str = "",
             moving: Collection[str] = ()) -> str:
    """The state after `step` in the memory tier (own + the peer's replica) when it has one, its copies outlive
    moving the workers `moving` (this rank's worker: `replica`) and the save is complete on every rank, else on
    disk (blocking); then close the checkpointer. Call on every rank. Which tier."""
    memory = ckpt.memory
    if memory is not None and not _copies_outlive_move(ckpt, memory.per_worker, replica, set(moving)):
        log.info("checkpoint request: the move takes some rank's memory copy and its replica; saving to disk")
        memory = None
    if memory is not None:
        memory.wait()  # a copy in flight first: one at a time
        if memory.newest_step != step:
            ckpt.save_to_memory(step, app)
            memory.wait()
        if memory.newest_step == step:  # agreed complete on every rank (tiers/peer.py)
            ckpt.close()
            return "memory"
    ckpt.save(step, app, blocking=True)
    ckpt.close()
    return "disk"


def _copies_outlive_move(ckpt: Checkpointer, per_worker: int, replica: str, moving: set[str]) -> bool:
    """copies_outlive over every rank's worker and every moved worker any rank read (gathered on every rank, so all
    decide alike even if the request changed between their reads of it)."""
    gathered: list[Any] = [(replica, sorted(moving))]
    if dist.is_available() and dist.is_initialized():
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (replica, sorted(moving)), group=ckpt.control_group)
    return copies_outlive([r for r, _ in gathered], per_worker, {m for _, moved in gathered for m in moved})


def stop_for_request(ckpt: Checkpointer, app: AppState, requests: CheckpointRequests, step: int,
                     replica: str = "") -> int:
    """The requested checkpoint of `step` on every rank (this rank's worker: `replica`), this rank's answer, and
    the exit code (STOPPED)."""
    tier = save_now(ckpt, step, app, replica=replica, moving=requests.moving())
    request_id = requests.answer(step)
    log.info("checkpoint request %s: step %d saved to %s; stopping (exit %d)", request_id, step, tier,
             exitcodes.STOPPED)
    return exitcodes.STOPPED
