"""The etcd key layout, in one place (the operator's cleanup and watches rely on it).

    /flywheel/rdzv/<run_id>/state           rendezvous state (DynamicRendezvousHandler's blob); token = mod_revision
    /flywheel/rdzv/<run_id>/store/<key>     torch.distributed.Store keys, each under its writer's store lease
    /flywheel/rdzv/<run_id>/commit/<nonce>  short-lived markers that make a retried `add`/`append` exactly-once
    /flywheel/workers/<run_id>/<replica>    liveness: one key per worker agent under a short-TTL lease
    /flywheel/progress/<run_id>/<rank>      training progress (flywheel/etcd/progress.py), under its writer's lease
"""

from __future__ import annotations

RDZV_ROOT = "/flywheel/rdzv/"
WORKERS_ROOT = "/flywheel/workers/"
PROGRESS_ROOT = "/flywheel/progress/"


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


def worker_key(run_id: str, replica_id: str) -> bytes:
    if not replica_id or "/" in replica_id:
        raise ValueError(f"replica id must be non-empty and contain no '/': {replica_id!r}")
    return workers_prefix(run_id) + replica_id.encode()


def progress_prefix(run_id: str) -> bytes:
    return f"{PROGRESS_ROOT}{_checked(run_id)}/".encode()


def progress_key(run_id: str, rank: int) -> bytes:
    return progress_prefix(run_id) + str(int(rank)).encode()
