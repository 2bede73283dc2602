"""Real elastic runs: 2 agents (torch's elastic_launch, 1 gloo worker each) rendezvous through etcd-v3."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from flywheel.etcd.liveness import list_live_workers, watch_workers

from .etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(150)

AGENT = Path(__file__).with_name("etcd_agent.py")
WORKER_TTL = 2


class Agent:
    """One agent subprocess in its own process group (so a SIGKILL takes its worker with it, like a lost pod)."""

    def __init__(self, endpoint: str, run_id: str, out_dir: Path, replica: int) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", FLYWHEEL_REPLICA_INDEX=str(replica), PYTHONUNBUFFERED="1")
        env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)  # the etcd-v3 handler must default it to 1 itself
        self.log_path = out_dir / f"agent{replica}.{time.monotonic_ns()}.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(AGENT), endpoint, run_id, str(out_dir), str(WORKER_TTL)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"agent did not finish in {timeout} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def cleanup(self) -> None:
        if self.process.poll() is None:
            self.kill()


def wait_for_files(out_dir: Path, pattern: str, count: int, timeout: float, agents: list[Agent]) -> list[Path]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(out_dir.glob(pattern))
        if len(found) >= count:
            return found
        time.sleep(0.05)
    logs = "\n".join(a.log() for a in agents)
    have = sorted(p.name for p in out_dir.iterdir())
    pytest.fail(f"{count} x {pattern} not seen in {timeout} s; have {have}\n{logs}")


def worker_pids(out_dir: Path, replica: int) -> set[int]:
    return {int(p.name.rsplit(".", 1)[1]) for p in out_dir.glob(f"running.{replica}.*")}


def finish(out_dir: Path, agents: list[Agent], timeout: float = 60) -> list[dict]:
    (out_dir / "go").touch()
    for agent in agents:
        assert agent.wait(timeout) == 0, agent.log()
    return [json.loads(p.read_text()) for p in sorted(out_dir.glob("done.*.json"))]


@pytest.fixture
def run(tmp_path: Path, etcd_server: EtcdServer):  # type: ignore[no-untyped-def]
    agents: list[Agent] = []
    run_id = f"test-{uuid.uuid4().hex[:8]}"

    def start(replica: int) -> Agent:
        agent = Agent(etcd_server.endpoint, run_id, tmp_path, replica)
        agents.append(agent)
        return agent

    yield start, run_id, tmp_path
    for agent in agents:
        agent.cleanup()


@pytest.mark.slow
def test_two_agents_rendezvous_and_finish(run, etcd_server: EtcdServer) -> None:  # type: ignore[no-untyped-def]
    start, run_id, out = run
    began = time.monotonic()
    agents = [start(0), start(1)]
    wait_for_files(out, "running.*", 2, 60, agents)
    print(f"\n2 agents: start -> first all_reduce {time.monotonic() - began:.1f} s")
    assert sorted(list_live_workers(etcd_server.endpoint, run_id)) == ["0", "1"]
    done = finish(out, agents)
    assert sorted((d["rank"], d["world"], d["restart"]) for d in done) == [(0, 2, 0), (1, 2, 0)]
    # Agents that end by themselves mark their liveness keys exited; the keys then expire with their leases.
    assert all(w.exited for w in list_live_workers(etcd_server.endpoint, run_id).values())
    deadline = time.monotonic() + 10
    while list_live_workers(etcd_server.endpoint, run_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list_live_workers(etcd_server.endpoint, run_id) == {}


@pytest.mark.slow
def test_killed_agent_is_seen_within_ttl_and_replaced(run, etcd_server: EtcdServer) -> None:  # type: ignore[no-untyped-def]
    start, run_id, out = run
    agents = [start(0), start(1)]
    wait_for_files(out, "running.*", 2, 60, agents)

    gone = threading.Event()
    watch = watch_workers(etcd_server.endpoint, run_id, lambda live: "1" not in live and gone.set())
    try:
        time.sleep(0.3)  # let the watch list both workers first
        assert not gone.is_set()
        killed_at = time.monotonic()
        agents[1].kill()
        assert gone.wait(WORKER_TTL + 3)
        detected = time.monotonic() - killed_at
    finally:
        watch.stop()
    print(f"\nSIGKILLed agent's liveness key gone after {detected:.2f} s (TTL {WORKER_TTL} s)")
    assert detected <= WORKER_TTL + 1

    restarted_at = time.monotonic()
    agents.append(start(1))
    # The survivor's agent stops its worker (failed with its peer, or a waiting node seen) and re-rendezvouses
    # with the new agent 1: both replicas then have a second worker (a new pid) training.
    first_pids = worker_pids(out, 0) | worker_pids(out, 1)
    wait_for_files(out, "running.1.*", 2, 60, agents)
    wait_for_files(out, "running.0.*", 2, 60, agents)
    print(f"replacement agent started -> both training again {time.monotonic() - restarted_at:.1f} s")
    done = finish(out, [agents[0], agents[2]])
    assert sorted((d["replica"], d["world"]) for d in done) == [("0", 2), ("1", 2)]
    assert not {d["pid"] for d in done} & first_pids


@pytest.mark.slow
def test_etcd_restart_mid_run_then_re_rendezvous(run, etcd_server: EtcdServer) -> None:  # type: ignore[no-untyped-def]
    start, run_id, out = run
    agents = [start(0), start(1)]
    wait_for_files(out, "running.*", 2, 60, agents)

    etcd_server.restart(down_seconds=1.0)  # same data dir, same ports
    time.sleep(1.5)  # agents' keep-alives and monitors hit the restarted etcd
    assert all(a.process.poll() is None for a in agents), "an agent died while etcd was down"
    assert sorted(list_live_workers(etcd_server.endpoint, run_id)) == ["0", "1"]

    # Force a new rendezvous round through the restarted etcd: both agents must start new workers.
    first_pids = worker_pids(out, 0) | worker_pids(out, 1)
    crashed_at = time.monotonic()
    (out / "crash-rank1").touch()
    wait_for_files(out, "running.0.*", 2, 60, agents)
    wait_for_files(out, "running.1.*", 2, 60, agents)
    took = time.monotonic() - crashed_at
    print(f"\nafter etcd restart: worker crash -> both re-rendezvoused and training {took:.1f} s")
    done = finish(out, agents)
    assert sorted((d["rank"], d["world"]) for d in done) == [(0, 2), (1, 2)]
    assert not {d["pid"] for d in done} & first_pids
    # The crashed worker's agent spent one restart; the other agent restarted for the membership change.
    assert max(d["restart"] for d in done) == 1
