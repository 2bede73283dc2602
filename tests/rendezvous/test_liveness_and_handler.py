"""Liveness keys, the operator's watch API, and the registered etcd-v3 handler, against a real etcd."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry

from flywheel.agent.rendezvous import handler as handler_module
from flywheel.agent.rendezvous.store import EtcdStore
from flywheel.etcd import keys as etcd_keys
from flywheel.etcd.liveness import WorkerRegistration, delete_run, list_live_workers, watch_workers
from flywheel.etcd.session import EtcdSession

from .etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[2]


def next_change(changes: "queue.Queue[set[str]]", timeout: float = 5.0) -> set[str]:
    return changes.get(timeout=timeout)


def test_watch_workers_follows_registrations_expiry_and_etcd_restart(etcd_server: EtcdServer) -> None:
    changes: queue.Queue[set[str]] = queue.Queue()
    watch = watch_workers(etcd_server.endpoint, "job-a", lambda live: changes.put(set(live)))
    with EtcdSession(etcd_server.endpoint) as session:
        try:
            assert next_change(changes) == set()
            first = WorkerRegistration(session, "job-a", "0", ttl=2).start()
            assert next_change(changes) == {"0"}
            second = WorkerRegistration(session, "job-a", "1", ttl=2).start()
            assert next_change(changes) == {"0", "1"}
            live = list_live_workers(session, "job-a")
            assert sorted(live) == ["0", "1"] and live["1"].pid > 0 and live["1"].lease_id != live["0"].lease_id

            began = time.monotonic()
            first.close()  # an agent ending by itself: marked exited, then gone after its TTL
            marked = list_live_workers(session, "job-a")
            assert marked["0"].exited and not marked["1"].exited
            # The marker keeps the registration time, so it never reads as a newer pod's key.
            assert marked["0"].since == live["0"].since
            assert next_change(changes) == {"0", "1"}  # the marker is a put
            assert watch.live_workers["0"].exited
            assert next_change(changes, timeout=5.0) == {"1"}
            assert 1.0 <= time.monotonic() - began <= 2 + 1

            assert second._lease is not None
            second._lease.stop()  # the keep-alive stops, as when the process is SIGKILLed
            began = time.monotonic()
            assert next_change(changes, timeout=5.0) == set()
            assert time.monotonic() - began <= 2 + 1

            etcd_server.restart(down_seconds=0.5)
            WorkerRegistration(session, "job-a", "2", ttl=2).start()
            assert next_change(changes, timeout=10.0) == {"2"}
            assert watch.live_workers.keys() == {"2"}
        finally:
            watch.stop()


def test_a_rank_restart_report_is_in_the_liveness_value_and_keeps_the_registration_time(
        etcd_server: EtcdServer) -> None:
    with EtcdSession(etcd_server.endpoint) as session:
        registration = WorkerRegistration(session, "job-r", "0", ttl=5).start()
        try:
            registered = list_live_workers(session, "job-r")["0"]
            assert registered.rank_restarts == 0 and registered.rank_restart_reason == ""
            registration.report_rank_restart(2, "rank 1: killed by SIGKILL", 1_800_000_000.5)
            reported = list_live_workers(session, "job-r")["0"]
            assert (reported.rank_restarts, reported.rank_restart_reason) == (2, "rank 1: killed by SIGKILL")
            assert reported.rank_restart_at == 1_800_000_000.5
            # The same agent: the operator must still tell it from a predecessor by its registration time.
            assert reported.since == registered.since and reported.lease_id == registered.lease_id
            registration.close()
            assert list_live_workers(session, "job-r")["0"].rank_restarts == 2  # the exited marker keeps it
        finally:
            registration.close()


def test_registration_survives_an_etcd_restart_longer_than_its_ttl(etcd_server: EtcdServer) -> None:
    """etcd keeps leases across a restart and renews them on recovery; if one is lost it is granted again."""
    with EtcdSession(etcd_server.endpoint) as session:
        WorkerRegistration(session, "job-b", "0", ttl=2).start()
        etcd_server.restart(down_seconds=3.0)
        time.sleep(3.0)
        assert sorted(list_live_workers(etcd_server.endpoint, "job-b")) == ["0"]


def test_delete_run_removes_only_that_run(etcd_server: EtcdServer) -> None:
    with EtcdSession(etcd_server.endpoint) as session:
        for run_id in ("job", "job-2"):
            EtcdStore(session, run_id).set("k", "v")
            WorkerRegistration(session, run_id, "0").start()
        # rdzv state + store key + worker key (the "job-2" keys share the "job" text but not the prefix)
        assert delete_run(etcd_server.endpoint, "job") == 2
        assert list_live_workers(session, "job") == {}
        assert sorted(list_live_workers(session, "job-2")) == ["0"]
        assert EtcdStore(session, "job-2").check(["k"])
    with pytest.raises(ValueError):
        etcd_keys.rdzv_prefix("a/b")


def test_registered_handler_rendezvous_one_node(etcd_server: EtcdServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    # The handler lets go of its session (liveness and store leases, watches) at the agent's exit: here, at the end
    # of the test, not of the test process (whose later tests would log its keep-alives failing for ever).
    releases: list[Callable[[], None]] = []
    monkeypatch.setattr(handler_module.atexit, "register", releases.append)
    params = RendezvousParameters(
        backend="etcd-v3",
        endpoint=etcd_server.endpoint,
        run_id="job-h",
        min_nodes=1,
        max_nodes=1,
        local_addr="127.0.0.1",
        replica_id="r7",
        worker_ttl=3,
        last_call_timeout=1,
    )
    handler = rendezvous_handler_registry.create_handler(params)
    assert handler.get_backend() == "etcd-v3"
    assert handler.use_agent_store is False  # the handler turned TCPStore sharing off
    assert sorted(list_live_workers(etcd_server.endpoint, "job-h")) == ["r7"]

    info = handler.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    assert info.bootstrap_store_info.master_addr == "127.0.0.1" and info.bootstrap_store_info.master_port > 0
    # MASTER_ADDR/PORT went through the etcd store (round-scoped prefix), not through a TCPStore in the agent.
    with EtcdSession(etcd_server.endpoint) as session:
        store = EtcdStore(session, "job-h", timeout=timedelta(seconds=2))
        assert store.get("torch.rendezvous.job-h.0/MASTER_ADDR") == b"127.0.0.1"
    assert handler.num_nodes_waiting() == 0
    assert handler.shutdown() is True
    assert handler.is_closed()
    assert len(releases) == 1
    releases.pop()()

    with pytest.raises(ValueError, match="keep_alive_max_attempt"):
        rendezvous_handler_registry.create_handler(
            RendezvousParameters(
                backend="etcd-v3",
                endpoint=etcd_server.endpoint,
                run_id="job-h2",
                min_nodes=1,
                max_nodes=1,
                keep_alive_max_attempt=2,
            )
        )


def test_the_agent_reports_each_rank_restart_in_place_in_its_liveness_key(etcd_server: EtcdServer,
                                                                          tmp_path: Path) -> None:
    """`flywheel launch` on etcd: rank 1 is SIGKILLed once, the agent restarts both ranks in place and the job
    ends well; its liveness key (marked exited, within its TTL) says one rank restart and why."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PET_NNODES": "1", "PET_NPROC_PER_NODE": "2",
           "PET_RDZV_BACKEND": "etcd-v3", "PET_RDZV_ENDPOINT": etcd_server.endpoint, "PET_RDZV_ID": "rank-restart",
           "PET_MAX_RESTARTS": "2", "FLYWHEEL_REPLICA_INDEX": "0", "EXIT_RANK_LOG": str(tmp_path / "attempts.log"),
           "EXIT_RANK_WHICH": "1", "EXIT_RANK_CODE": "-9", "EXIT_RANK_ONCE": "1",
           # The exited agent's key lives out its lease: 30 s, so a loaded host's read after the exit still finds it
           # (the default 3 s was missed once).
           "PET_RDZV_CONF": "worker_ttl=30"}
    script = REPO / "tests" / "local" / "scripts" / "exit_rank.py"
    proc = subprocess.run([sys.executable, "-m", "flywheel.cli", "launch", "--", str(script)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr[-2000:]
    worker = list_live_workers(etcd_server.endpoint, "rank-restart")["0"]
    assert worker.exited and worker.rank_restarts == 1
    assert worker.rank_restart_reason == "rank 1: killed by SIGKILL" and time.time() - worker.rank_restart_at < 60
