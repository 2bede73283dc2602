"""Drain ahead, the agents' side, through a real etcd and two `flywheel launch` agents: once the ranks answered the
operator's checkpoint request and stopped, the agent of the worker the request moves does not join a new round (it
would train steps that the move throws away: 3 were, in CI, when the operator's deletion came after the round); it
waits for its pod's deletion (SIGTERM), and the staying worker's new round forms with the replacement. A drain given
up (the request deleted) lets it rejoin at once (agent/drain_hold.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flywheel.contracts import exitcodes
from flywheel.etcd import requests as etcd_requests
from flywheel.etcd.session import EtcdSession

from .etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(150)
REPO = Path(__file__).resolve().parents[2]
RANK = Path(__file__).with_name("drain_rank.py")
HELD = "waiting for its pod's deletion"


class Agents:
    def __init__(self, endpoint: str, run_id: str, out: Path) -> None:
        self.endpoint, self.run_id, self.out = endpoint, run_id, out
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, replica: int, name: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "1",
               "PET_RDZV_BACKEND": "etcd-v3", "PET_RDZV_ENDPOINT": self.endpoint, "PET_RDZV_ID": self.run_id,
               "PET_MAX_RESTARTS": "3", "FLYWHEEL_REPLICA_INDEX": str(replica),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        with open(self.out / f"{name}.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "flywheel.cli", "launch", "--", str(RANK), str(self.out)],
                                    env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.out / f"{name}.log").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in self.out.glob("*.log"))

    def starts(self, replica: int) -> int:
        return len(list(self.out.glob(f"started.{replica}.*")))

    def wait_for(self, what: str, ready: object, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():  # type: ignore[operator]
                return
            time.sleep(0.05)
        pytest.fail(f"{what} within {timeout} s\n{self.logs()}")


@pytest.fixture
def agents(etcd_server: EtcdServer, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Agents]:
    group = Agents(etcd_server.endpoint, request.node.name.replace("_", "-")[:40], tmp_path)
    yield group
    for proc in group.procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _stop_both_for_a_move(agents: Agents, session: EtcdSession) -> tuple[subprocess.Popen[bytes], ...]:
    """Agents 0 and 1 running; the request moving replica 1 answered by both ranks; agent 0 restarted into a new
    round, agent 1 holding."""
    staying, moving = agents.start(0, "agent-0"), agents.start(1, "agent-1")
    agents.wait_for("both ranks started", lambda: agents.starts(0) == agents.starts(1) == 1)
    request = etcd_requests.CheckpointRequest("r1", "node n1 is cordoned", moving=(1,))
    session.run(etcd_requests.put_request(session, agents.run_id, request))
    # The staying agent restarts its stopped rank into a new round: the one the moved agent must stay out of.
    agents.wait_for("the staying agent's restart", lambda: "restarting the ranks in place" in agents.log("agent-0"))
    time.sleep(3)  # many monitor intervals and rendezvous polls
    assert moving.poll() is None and staying.poll() is None, agents.logs()
    assert agents.starts(0) == agents.starts(1) == 1, f"a round formed with the moved worker\n{agents.logs()}"
    assert HELD in agents.log("agent-1")
    return staying, moving


@pytest.mark.slow
def test_the_moved_workers_agent_waits_for_its_deletion_and_the_replacement_joins(agents: Agents) -> None:
    with EtcdSession(agents.endpoint, retry_seconds=5.0) as session:
        staying, moving = _stop_both_for_a_move(agents, session)
        assert "restarting the ranks in place" not in agents.log("agent-1")
        moving.send_signal(signal.SIGTERM)  # its pod deleted by the move
        assert moving.wait(timeout=30) == exitcodes.STOPPED, agents.logs()
        replacement = agents.start(1, "replacement-1")  # the promoted spare (or a new pod) of index 1
        assert staying.wait(timeout=90) == 0 and replacement.wait(timeout=30) == 0, agents.logs()
        assert agents.starts(0) == agents.starts(1) == 2  # one round after the move, with the replacement


@pytest.mark.slow
def test_a_drain_given_up_lets_the_held_agent_rejoin(agents: Agents) -> None:
    with EtcdSession(agents.endpoint, retry_seconds=5.0) as session:
        staying, moving = _stop_both_for_a_move(agents, session)
        session.run(etcd_requests.clear_requests(session, agents.run_id))  # e.g. another worker failed first
        assert staying.wait(timeout=90) == 0 and moving.wait(timeout=30) == 0, agents.logs()
        assert agents.starts(0) == agents.starts(1) == 2
        assert "the drain no longer moves this worker" in agents.log("agent-1")
