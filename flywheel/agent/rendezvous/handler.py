"""`create_etcd_v3_handler`: torch's DynamicRendezvousHandler on the etcd v3 backend and store.

Rendezvous parameters (torchrun `--rdzv-conf k=v,...` / `PET_RDZV_CONF`, on top of torch's own `join_timeout`,
`last_call_timeout`, `close_timeout`, `heartbeat_timeout`, `keep_alive_interval`, `keep_alive_max_attempt`):

    read_timeout        seconds per etcd request (default 5)
    etcd_retry_timeout  seconds an operation keeps retrying while etcd is unreachable (default 30)
    store_ttl           lease TTL of the store keys an agent wrote, after it is gone (default 30)
    worker_ttl          lease TTL of the worker's liveness key (default 3)
    replica_id          liveness key name (default: $FLYWHEEL_REPLICA_INDEX, else the hostname); ranks follow its
                        number (rank_order.py), so rank = replica index x procs per replica + local rank
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Collection

from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.api import RendezvousParameters
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

from flywheel.agent import drain_hold, rank_restarts, restart_requests
from flywheel.agent.rank_order import RENDEZVOUS_POLL_SECONDS, create_ordered_handler
from flywheel.contracts import exitcodes, termination_log
from flywheel.contracts.replica import replica_id_from_env
from flywheel.etcd import keys
from flywheel.etcd import requests as etcd_requests
from flywheel.etcd.liveness import DEFAULT_WORKER_TTL, WorkerRegistration
from flywheel.etcd.rank_restart import RankRestartFollower
from flywheel.etcd.session import EtcdSession
from flywheel.torch_compat import set_rendezvous_poll_interval

from .backend import BACKEND_NAME, EtcdV3RendezvousBackend
from .state_watch import RendezvousStateWatch
from .store import DEFAULT_STORE_LEASE_TTL, EtcdStore

log = logging.getLogger(__name__)

# With fewer keep-alive attempts a slow heartbeat let two groups form under one run id (split brain, measured).
MIN_KEEP_ALIVE_ATTEMPTS = 3
SHARE_TCP_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def _int_param(params: RendezvousParameters, key: str, default: int) -> int:
    value = params.get_as_int(key, default)
    if value is None or value <= 0:
        raise ValueError(f"rendezvous parameter {key} must be a positive integer, got {value!r}")
    return value


def create_etcd_v3_handler(params: RendezvousParameters) -> DynamicRendezvousHandler:
    """The `etcd-v3` handler creator registered with torch's rendezvous handler registry."""
    if not params.endpoint:
        raise ValueError("the etcd-v3 rendezvous needs an endpoint: host:port[,host:port]")
    if _int_param(params, "keep_alive_max_attempt", 3) < MIN_KEEP_ALIVE_ATTEMPTS:
        raise ValueError(f"keep_alive_max_attempt must be >= {MIN_KEEP_ALIVE_ATTEMPTS} (split-brain risk)")

    # Not sharing the rendezvous TCPStore with the workers: the shared one made restarts flaky (stale gloo
    # addresses, pytorch#135712). Workers' rank 0 then hosts a fresh TCPStore for each group instead.
    if os.environ.setdefault(SHARE_TCP_STORE_ENV, "1") != "1":
        log.warning("%s is not 1: the rendezvous rank 0 agent will host a shared TCPStore", SHARE_TCP_STORE_ENV)

    session = EtcdSession(
        params.endpoint,
        rpc_timeout=float(_int_param(params, "read_timeout", 5)),
        retry_seconds=float(_int_param(params, "etcd_retry_timeout", 30)),
        name=f"flywheel-etcd-{params.run_id}",
    )
    backend = EtcdV3RendezvousBackend(session, params.run_id)
    store = EtcdStore(session, params.run_id, lease_ttl=_int_param(params, "store_ttl", DEFAULT_STORE_LEASE_TTL))
    replica_id = params.get("replica_id") or replica_id_from_env()
    # Before the liveness key: the operator asks only agents it saw alive, so every request meant for this agent
    # comes after what the follower reads first (served already: an older generation's).
    follower = RankRestartFollower(session, params.run_id)
    restart_requests.sources.add(follower.take)  # the agent restarts its ranks in place when asked (launch.py)
    registration = WorkerRegistration(
        session,
        params.run_id,
        replica_id,
        ttl=_int_param(params, "worker_ttl", DEFAULT_WORKER_TTL),
        on_replaced=lambda holder: end_replaced_agent(replica_id, holder),
    ).start()
    rank_restarts.reporters.add(registration.report_rank_restart)  # the operator counts them from the key

    def moved_by_drain(ranks: Collection[int]) -> bool:  # read when the agent would rejoin (drain_hold.py)
        state = session.run(etcd_requests.read_state(session, params.run_id))
        return etcd_requests.held_for_move(state, replica_id, ranks)

    drain_hold.sources.add(moved_by_drain)

    handler = create_ordered_handler(store, backend, params, replica_id, before_join=registration.still_held)
    state_watch = RendezvousStateWatch(session, keys.state_key(params.run_id), handler)
    set_rendezvous_poll_interval(RENDEZVOUS_POLL_SECONDS, wait=state_watch.wait)

    def release() -> None:
        state_watch.stop()
        restart_requests.sources.remove(follower.take)
        drain_hold.sources.remove(moved_by_drain)
        follower.stop()
        rank_restarts.reporters.remove(registration.report_rank_restart)
        registration.close()
        store.close()
        session.close()

    atexit.register(release)
    return handler


def end_replaced_agent(replica_id: str, holder: str) -> None:
    """This agent was cut off (its node lost, frozen, partitioned), given up by the operator and replaced: another
    agent holds its replica's liveness key. Rejoining would put a second agent of the replica into the group (or
    on its wait list, restarting the live group to admit it), so it ends at once, with its ranks (they die with
    their agent: PDEATHSIG) and without any checkpoint of its stale state."""
    message = (f"replica {replica_id} was replaced while this agent was cut off (its liveness key is now held by "
               f"{holder}); this agent ends without rejoining the group")
    log.error(message)
    termination_log.write_reason(message)
    logging.shutdown()
    os._exit(exitcodes.STOPPED)


# Importing this module is what `PET_RDZV_BACKEND=etcd-v3` needs: torch looks the backend up in its registry.
rendezvous_handler_registry.register(BACKEND_NAME, create_etcd_v3_handler)
