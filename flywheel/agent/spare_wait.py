"""A warm spare's wait: `flywheel launch` with FLYWHEEL_SPARE=1.

The agent starts its warm zygote first (launch.py), so torch and the trainer are imported while the spare waits; it
then waits for its promotion: on a cluster (etcd-v3 rendezvous) it holds its spare key while it watches its promote
key (flywheel/etcd/spares.py); under `flywheel run` it polls the promotion file the supervisor writes
(flywheel/contracts/spare_promotion.py). Promoted, it applies the replica's env to os.environ (FLYWHEEL_REPLICA_INDEX
and whatever else differs), removes its spare key and returns: the agent then joins the next rendezvous round as a
replacement worker would, forking its ranks from the same zygote. Rank = replica index holds (rank_order.py reads
the index when the rendezvous handler is created, after this).

SIGTERM or SIGINT while waiting ends the spare cleanly (exit 0): a spare deleted or stopped with its job is no
failure.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from flywheel.agent import warm
from flywheel.contracts import exitcodes, termination_log
from flywheel.contracts.replica import SPARE_ENV, SPARE_ID_ENV, SPARE_PROMOTION_FILE_ENV
from flywheel.contracts.spare_promotion import Promotion, mark_ready, wait_for_promotion_file

log = logging.getLogger(__name__)

READY_POLL_S = 0.05


class SpareConfigError(ValueError):
    """A spare that nothing could promote."""


def spare_id_from_env(env: Mapping[str, str]) -> str:
    """The spare's name: FLYWHEEL_SPARE_ID (the pod name on a cluster, spare-<n> locally), else the hostname."""
    return env.get(SPARE_ID_ENV) or socket.gethostname()


def become_replica(run_id: str, rdzv_backend: str, rdzv_endpoint: str, zygote_env: Mapping[str, str]) -> int | None:
    """`flywheel launch` of a spare: wait for the promotion. None: promoted, go on as the replica (os.environ holds
    its env); else the exit code (0: stopped while waiting, a spare deleted is no failure; USER_ERROR: nothing
    could promote it)."""
    preload_agent_modules()  # while it waits: the promoted agent goes straight to its rendezvous
    try:
        promoted = wait_as_spare(run_id, rdzv_backend, rdzv_endpoint, zygote_env)
    except SpareConfigError as err:
        print(f"flywheel launch: {err}", file=sys.stderr)
        termination_log.write_reason(str(err))
        return exitcodes.USER_ERROR
    return None if promoted else exitcodes.SUCCESS


def preload_agent_modules() -> None:
    """Import the modules the agent imports once it runs (launch._run_agent), with its LOGLEVEL: torch's elastic
    loggers take their level from it when first imported."""
    caller_loglevel = os.environ.get("LOGLEVEL")
    os.environ["LOGLEVEL"] = "INFO"
    try:
        importlib.import_module("torch.distributed.elastic.agent.server.local_elastic_agent")
        importlib.import_module("torch.distributed.elastic.rendezvous.c10d_rendezvous_backend")
        importlib.import_module("flywheel.agent.rank_order")
    finally:
        if caller_loglevel is None:
            del os.environ["LOGLEVEL"]
        else:
            os.environ["LOGLEVEL"] = caller_loglevel


def wait_as_spare(run_id: str, rdzv_backend: str, rdzv_endpoint: str, zygote_env: Mapping[str, str]) -> bool:
    """Wait to be promoted. True: promoted, os.environ now holds the replica's env. False: stopped while waiting.
    `zygote_env` is the warm zygote's client env (empty without one): the spare says it is ready once the zygote
    has imported the trainer."""
    spare_id = spare_id_from_env(os.environ)
    promotion_file = os.environ.get(SPARE_PROMOTION_FILE_ENV, "")
    if not promotion_file and rdzv_backend != "etcd-v3":
        raise SpareConfigError(f"{SPARE_ENV}=1 needs the etcd-v3 rendezvous backend (PET_RDZV_BACKEND) or "
                               f"{SPARE_PROMOTION_FILE_ENV} (local runs): nothing could promote this spare")
    began = time.monotonic()
    with _stop_on_signals() as stop:
        if not _zygote_ready(zygote_env, stop):
            promotion = None
        elif promotion_file:
            mark_ready(promotion_file)
            promotion = wait_for_promotion_file(promotion_file, stop)
        else:
            promotion = _wait_in_etcd(run_id, rdzv_endpoint, spare_id, stop)
    if promotion is None:
        log.warning("spare %s stopped while waiting for its promotion", spare_id)
        return False
    apply_promotion(promotion, os.environ)
    log.warning("spare %s promoted to replica %s after %.1f s waiting", spare_id, promotion.replica,
                time.monotonic() - began)
    return True


def apply_promotion(promotion: Promotion, env: dict[str, str] | os._Environ[str]) -> None:
    """Become the replica: its env, and no longer a spare (the ranks and a restarted agent see a worker)."""
    env.update(promotion.env_to_apply())
    for name in (SPARE_ENV, SPARE_PROMOTION_FILE_ENV):
        env.pop(name, None)


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _zygote_ready(zygote_env: Mapping[str, str], stop: threading.Event) -> bool:
    """Wait until the zygote has imported the trainer (its socket appears then); False when stopped first. A zygote
    that died is no reason to stay out: the ranks then start cold, as with any worker."""
    path, pid = zygote_env.get(warm.SOCKET_ENV), int(zygote_env.get(warm.PID_ENV) or 0)
    deadline = time.monotonic() + warm.READY_TIMEOUT_S
    while path and not os.path.exists(path) and time.monotonic() < deadline and _alive(pid):
        if stop.wait(READY_POLL_S):
            return False
    return not stop.is_set()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


def _wait_in_etcd(run_id: str, endpoint: str, spare_id: str, stop: threading.Event) -> Promotion | None:
    from flywheel.etcd.session import EtcdSession
    from flywheel.etcd.spares import SpareRegistration, wait_for_promotion

    with EtcdSession(endpoint, name=f"flywheel-spare-{run_id}") as session:
        registration = SpareRegistration(session, run_id, spare_id).start()
        try:
            return wait_for_promotion(session, run_id, spare_id, stop)
        finally:
            registration.close()  # promoted or stopped: no longer a waiting spare
