"""The etcd key layout, in one place (the operator's cleanup and watches rely on it).

    /flywheel/rdzv/<run_id>/state           rendezvous state (DynamicRendezvousHandler's blob); token = mod_revision
    /flywheel/rdzv/<run_id>/store/<key>     torch.distributed.Store keys, each under its writer's store lease
    /flywheel/rdzv/<run_id>/commit/<nonce>  short-lived markers that make a retried `add`/`append` exactly-once
    /flywheel/workers/<run_id>/<replica>    liveness: one key per worker agent under a short-TTL lease
    /flywheel/progress/<run_id>/<rank>      training progress (flywheel/etcd/progress.py), under its writer's lease
    /flywheel/spares/<run_id>/<spare_id>    a waiting warm spare (flywheel/etcd/spares.py) under its agent's lease
    /flywheel/promote/<run_id>/<spare_id>   the operator's promotion of that spare: {"replica", "env"} (no lease)
    /flywheel/requests/<run_id>/checkpoint  the operator's drain-ahead request: {"id", "reason"} (no lease)
    /flywheel/requests/<run_id>/done/<rank> a rank's answer: {"id", "step"}: it holds that request's checkpoint
    /flywheel/restart/<run_id>/ranks        the operator's request that every worker's agent restart its ranks in
                                            place, for worker generation G: {"generation", "reason"} (no lease: an
                                            agent started later reads it too, as already served; rank_restart.py)
"""

from __future__ import annotations

RDZV_ROOT = "/flywheel/rdzv/"
WORKERS_ROOT = "/flywheel/workers/"
PROGRESS_ROOT = "/flywheel/progress/"
SPARES_ROOT = "/flywheel/spares/"
PROMOTE_ROOT = "/flywheel/promote/"
REQUESTS_ROOT = "/flywheel/requests/"
RESTART_ROOT = "/flywheel/restart/"


def _checked(run_id: str) -> str:
    if not run_id or "/" in run_id:
        raise ValueError(f"run id must be non-empty and contain no '/': {run_id!r}")
    return run_id


def rdzv_prefix(run_id: str) -> bytes:
    return f"{RDZV_ROOT}{_checked(run_id)}/".encode()


def state_key(run_id: str) -> bytes:
    return rdzv_prefix(run_id) + b"state"


def store_prefix(run_id: str) -> bytes:
    return rdzv_prefix(run_id) + b"store/"


def commit_marker_prefix(run_id: str) -> bytes:
    return rdzv_prefix(run_id) + b"commit/"


def workers_prefix(run_id: str) -> bytes:
    return f"{WORKERS_ROOT}{_checked(run_id)}/".encode()


def _checked_name(what: str, name: str) -> bytes:
    if not name or "/" in name:
        raise ValueError(f"{what} must be non-empty and contain no '/': {name!r}")
    return name.encode()


def worker_key(run_id: str, replica_id: str) -> bytes:
    return workers_prefix(run_id) + _checked_name("replica id", replica_id)


def progress_prefix(run_id: str) -> bytes:
    return f"{PROGRESS_ROOT}{_checked(run_id)}/".encode()


def progress_key(run_id: str, rank: int) -> bytes:
    return progress_prefix(run_id) + str(int(rank)).encode()


def spares_prefix(run_id: str) -> bytes:
    return f"{SPARES_ROOT}{_checked(run_id)}/".encode()


def spare_key(run_id: str, spare_id: str) -> bytes:
    return spares_prefix(run_id) + _checked_name("spare id", spare_id)


def promote_prefix(run_id: str) -> bytes:
    return f"{PROMOTE_ROOT}{_checked(run_id)}/".encode()


def promote_key(run_id: str, spare_id: str) -> bytes:
    return promote_prefix(run_id) + _checked_name("spare id", spare_id)


def requests_prefix(run_id: str) -> bytes:
    return f"{REQUESTS_ROOT}{_checked(run_id)}/".encode()


def checkpoint_request_key(run_id: str) -> bytes:
    return requests_prefix(run_id) + b"checkpoint"


def checkpoint_done_prefix(run_id: str) -> bytes:
    return requests_prefix(run_id) + b"done/"


def checkpoint_done_key(run_id: str, rank: int) -> bytes:
    return checkpoint_done_prefix(run_id) + str(int(rank)).encode()


def restart_prefix(run_id: str) -> bytes:
    return f"{RESTART_ROOT}{_checked(run_id)}/".encode()


def rank_restart_key(run_id: str) -> bytes:
    return restart_prefix(run_id) + b"ranks"
