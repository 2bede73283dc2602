"""Warm spares against a real etcd: the spare keys and promotion (flywheel/etcd/spares.py) and a real
`flywheel launch` spare agent that registers, waits, and on promotion joins as worker <i>."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from flywheel.contracts.spare_promotion import Promotion
from flywheel.etcd import keys
from flywheel.etcd.liveness import delete_run, list_live_workers, watch_workers
from flywheel.etcd.session import EtcdSession
from flywheel.etcd.spares import LiveSpare, SpareRegistration, promote, wait_for_promotion, watch_spares

from .etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(90)
REPO = Path(__file__).resolve().parents[2]
RANK = Path(__file__).with_name("spare_rank.py")


def test_spare_keys_are_watched_and_a_promotion_written_before_the_wait_is_found(etcd_server: EtcdServer) -> None:
    changes: queue.Queue[dict[str, LiveSpare]] = queue.Queue()
    watch = watch_spares(etcd_server.endpoint, "job-s", lambda live: changes.put(live))
    with EtcdSession(etcd_server.endpoint) as session:
        try:
            assert changes.get(timeout=5) == {}
            registration = SpareRegistration(session, "job-s", "job-s-spare-0", ttl=2).start()
            live = changes.get(timeout=5)
            spare = live["job-s-spare-0"]
            assert spare.ready and spare.pid == os.getpid()
            # The operator may promote before the agent waits (or a promoted pod's container restarts): read first.
            session.run(promote(session, "job-s", "job-s-spare-0", 2, {"A": "b"}))
            stop = threading.Event()
            assert wait_for_promotion(session, "job-s", "job-s-spare-0", stop) == Promotion("2", {"A": "b"})
            registration.close()
            assert changes.get(timeout=5) == {}  # removed at once, not after the TTL
            # The promote key has no lease: the run's cleanup removes it.
            assert delete_run(session, "job-s") == 1
            assert session.call(lambda c: c.get(keys.promote_key("job-s", "job-s-spare-0"))) is None
            # A stopped wait returns None.
            threading.Timer(0.2, stop.set).start()
            assert wait_for_promotion(session, "job-s", "job-s-spare-9", stop) is None
        finally:
            watch.stop()


def _spare_agent(endpoint: str, run_id: str, out: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PET_NNODES="1", PET_NPROC_PER_NODE="1",
               PET_RDZV_BACKEND="etcd-v3", PET_RDZV_ENDPOINT=endpoint, PET_RDZV_ID=run_id,
               PET_RDZV_CONF="worker_ttl=3", FLYWHEEL_SPARE="1", FLYWHEEL_SPARE_ID="job-spare-0")
    env.pop("FLYWHEEL_REPLICA_INDEX", None)
    log = open(out / "spare.log", "wb")
    return subprocess.Popen([sys.executable, "-m", "flywheel.cli", "launch", "--", "python", str(RANK),
                             str(out / "rank.json")], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                            start_new_session=True)


def _wait_for(what: str, predicate: Callable[[], bool], agent: subprocess.Popen[bytes], log: Path,
              timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline or agent.poll() is not None:
            agent.kill()
            pytest.fail(f"{what} did not happen (agent exit {agent.poll()}):\n{log.read_text(errors='replace')}")
        time.sleep(0.05)


def test_a_spare_agent_waits_out_of_the_rendezvous_and_joins_as_the_replica_it_is_promoted_to(
        etcd_server: EtcdServer, tmp_path: Path) -> None:
    agent = _spare_agent(etcd_server.endpoint, "job-p", tmp_path)
    log = tmp_path / "spare.log"
    with EtcdSession(etcd_server.endpoint) as session:
        spares = keys.spare_key("job-p", "job-spare-0")
        _wait_for("the spare key", lambda: session.call(lambda c: c.get(spares)) is not None, agent, log)
        time.sleep(1.0)
        assert list_live_workers(session, "job-p") == {}  # waiting: not a worker, not in the rendezvous
        assert session.call(lambda c: c.get(keys.state_key("job-p"))) is None
        assert not (tmp_path / "rank.json").exists()
        seen: list[set[str]] = []
        workers = watch_workers(session, "job-p", lambda live: seen.append(set(live)))
        session.run(promote(session, "job-p", "job-spare-0", 1, {"PROMOTED_SETTING": "yes"}))
        try:
            assert agent.wait(timeout=60) == 0, log.read_text(errors="replace")
        finally:
            workers.stop()
        assert {"1"} in seen  # registered as worker 1 (the usual liveness key)
        assert session.call(lambda c: c.get(spares)) is None
    rank = json.loads((tmp_path / "rank.json").read_text())
    assert rank == {"RANK": "0", "WORLD_SIZE": "1", "FLYWHEEL_REPLICA_INDEX": "1", "FLYWHEEL_SPARE": None,
                    "FLYWHEEL_SPARE_ID": "job-spare-0", "PROMOTED_SETTING": "yes"}
    assert "spare job-spare-0 promoted to replica 1 after" in log.read_text()


def test_a_spare_stopped_while_waiting_exits_0_and_leaves_no_key(etcd_server: EtcdServer, tmp_path: Path) -> None:
    agent = _spare_agent(etcd_server.endpoint, "job-t", tmp_path)
    log = tmp_path / "spare.log"
    with EtcdSession(etcd_server.endpoint) as session:
        spares = keys.spare_key("job-t", "job-spare-0")
        _wait_for("the spare key", lambda: session.call(lambda c: c.get(spares)) is not None, agent, log)
        os.killpg(agent.pid, signal.SIGTERM)
        assert agent.wait(timeout=20) == 0, log.read_text(errors="replace")
        assert session.call(lambda c: c.get(spares)) is None
    assert "stopped while waiting" in log.read_text()
