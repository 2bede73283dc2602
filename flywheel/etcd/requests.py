"""Drain ahead in etcd: the operator's checkpoint request and each rank's answer.

Before moving a worker off a draining node the operator PUTs `/flywheel/requests/<run_id>/checkpoint` =
{"id", "reason", "moving"} (no lease: a rank restarted in place still finds it; `moving`: the replica indices of the
workers it will move). Every rank follows that key
(`watch_requests`); at the next step boundary all ranks agree to act on it, save, and each PUTs
`/flywheel/requests/<run_id>/done/<rank>` = {"id", "step"}: it holds that request's checkpoint of `step`. The
operator follows the answers (`watch_requests` too) and, once every rank answered the request's id, moves the
worker; it deletes the prefix (`clear_requests`) once the moved pods are gone, or at once when it gives the drain
up. A rank that already answered a request id never acts on it again. The run's cleanup (`liveness.delete_run`)
deletes whatever is left.

An agent whose replica the open request moves and whose ranks answered it never joins a new rendezvous round
(`held_for_move`, agent/drain_hold.py): its pod is about to be deleted, and a round with it would train steps
that the move throws away.

Torch-free, like liveness.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from . import keys
from .prefix_watch import PrefixWatch
from .session import EtcdSession

REQUEST_NAME = "checkpoint"  # the request key's last path segment (the answers' are rank numbers under done/)


@dataclass(frozen=True)
class CheckpointRequest:
    id: str
    reason: str = ""
    moving: tuple[int, ...] = ()  # the replica indices of the workers the drain moves


@dataclass(frozen=True)
class CheckpointDone:
    rank: int
    id: str
    step: int


def encode_request(request: CheckpointRequest) -> bytes:
    return json.dumps({"id": request.id, "reason": request.reason, "moving": list(request.moving)}).encode()


def decode_request(value: bytes) -> CheckpointRequest | None:
    info = _json(value)
    if not info.get("id"):
        return None
    moving = info.get("moving")
    indices = tuple(int(i) for i in moving if isinstance(i, int)) if isinstance(moving, list) else ()
    return CheckpointRequest(str(info["id"]), str(info.get("reason", "")), indices)


def encode_done(done: CheckpointDone) -> bytes:
    return json.dumps({"id": done.id, "step": done.step}).encode()


def decode_done(rank: str, value: bytes) -> CheckpointDone | None:
    info = _json(value)
    if not rank.isdigit() or not info.get("id"):
        return None
    try:
        return CheckpointDone(int(rank), str(info["id"]), int(info.get("step", 0)))
    except (TypeError, ValueError):
        return None


def _json(value: bytes) -> dict[str, Any]:
    try:
        info = json.loads(value)
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


@dataclass(frozen=True)
class RequestState:
    """What the requests prefix holds: the open request (None: none) and the answers by rank."""

    request: CheckpointRequest | None
    done: dict[int, CheckpointDone]


def held_for_move(state: RequestState, replica_id: str, ranks: Collection[int]) -> bool:
    """Whether an agent of replica `replica_id`, whose ranks were `ranks`, is being moved by the open request and
    stopped for it (one of its ranks answered it: they all stop after the same step)."""
    request = state.request
    if request is None or replica_id not in {str(i) for i in request.moving}:
        return False
    return any(state.done[r].id == request.id for r in ranks if r in state.done)


def parse_entries(entries: dict[str, tuple[bytes, bytes]]) -> RequestState:
    """{last path segment: (key, value)} of the prefix -> the request and the answers."""
    request = None
    done: dict[int, CheckpointDone] = {}
    for name, (key, value) in entries.items():
        if name == REQUEST_NAME:
            request = decode_request(value)
        elif b"/done/" in key:
            answer = decode_done(name, value)
            if answer is not None:
                done[answer.rank] = answer
    return RequestState(request, done)


async def put_request(session: EtcdSession, run_id: str, request: CheckpointRequest) -> None:
    """The operator's request (idempotent: the same id again is the same request)."""
    await session.call_async(lambda c: c.put(keys.checkpoint_request_key(run_id), encode_request(request)))


async def clear_requests(session: EtcdSession, run_id: str) -> None:
    """The drain is over (moved, or given up): the request and its answers go."""
    await session.call_async(lambda c: c.delete_prefix(keys.requests_prefix(run_id)))


async def put_done(session: EtcdSession, run_id: str, done: CheckpointDone) -> None:
    await session.call_async(lambda c: c.put(keys.checkpoint_done_key(run_id, done.rank), encode_done(done)))


async def read_state(session: EtcdSession, run_id: str) -> RequestState:
    listing = await session.call_async(lambda c: c.get_prefix(keys.requests_prefix(run_id)))
    return parse_entries({kv.key.rsplit(b"/", 1)[-1].decode(): (kv.key, kv.value) for kv in listing})


def watch_requests(endpoints: str | EtcdSession, run_id: str, on_change: Callable[[RequestState], None], *,
                   shared: bool = False) -> PrefixWatch[tuple[bytes, bytes]]:
    """Follow the run's request and answers; `on_change(state)` on the session's loop thread (keep it quick).
    shared: see liveness.watch_workers (the operator's; a rank follows its own run only)."""
    return PrefixWatch(endpoints, keys.requests_prefix(run_id), lambda kv: (bytes(kv.key), bytes(kv.value)),
                       lambda entries: on_change(parse_entries(entries)), "checkpoint requests", shared=shared)
