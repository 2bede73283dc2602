"""`flywheel launch` on etcd asked by the operator to restart its ranks in place (flywheel/etcd/rank_restart.py):
its SIGSTOPped ranks are SIGKILLed and started again by the same agent, the restart is reported in its liveness
key, it spends none of the agent's own restart budget, and a request already in etcd when the agent started is
never served."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flywheel.etcd.liveness import list_live_workers
from flywheel.etcd.rank_restart import RankRestartRequest, put_request
from flywheel.etcd.session import EtcdSession
from tests.rank_processes import alive, process_state

from .etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(90)
REPO = Path(__file__).resolve().parents[2]
RANK = Path(__file__).with_name("stop_rank.py")


@pytest.mark.slow
def test_an_agent_asked_to_restart_its_hung_ranks_kills_and_restarts_them_in_place(etcd_server: EtcdServer,
                                                                                  tmp_path: Path) -> None:
    run_id = "in-place"
    with EtcdSession(etcd_server.endpoint) as session:
        # A request left from an older generation (before this worker's pod was created): not for this agent.
        session.run(put_request(session, run_id, RankRestartRequest(1, "an older generation's hang")))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PET_NNODES": "1", "PET_NPROC_PER_NODE": "2",
               "PET_RDZV_BACKEND": "etcd-v3", "PET_RDZV_ENDPOINT": etcd_server.endpoint, "PET_RDZV_ID": run_id,
               "PET_MAX_RESTARTS": "0",  # no restart of its own left: the operator's request must not need one
               "FLYWHEEL_REPLICA_INDEX": "0", "PYTHONPATH": os.pathsep.join(filter(None, [
                   str(REPO), os.environ.get("PYTHONPATH")]))}
        log = tmp_path / "agent.log"
        with open(log, "wb") as out:
            agent = subprocess.Popen([sys.executable, "-m", "flywheel.cli", "launch", "--", str(RANK), str(tmp_path)],
                                     env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 45
            while time.monotonic() < deadline:
                first = [int(p.name.rsplit(".", 1)[1]) for p in tmp_path.glob("started.*")]
                if len(first) == 2 and all(process_state(pid) == "T" for pid in first):
                    break
                assert agent.poll() is None, log.read_text()[-3000:]
                time.sleep(0.05)
            else:
                pytest.fail(f"the ranks did not stop themselves:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)  # past a few monitor intervals: the stale request restarted nothing
            assert len(list(tmp_path.glob("started.*"))) == 2 and all(process_state(pid) == "T" for pid in first)
            session.run(put_request(session, run_id, RankRestartRequest(2, "no training step for 5 s")))
            assert agent.wait(timeout=40) == 0, log.read_text()[-3000:]
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
        pids = [int(p.name.rsplit(".", 1)[1]) for p in tmp_path.glob("started.*")]
        assert len(pids) == 4, sorted(p.name for p in tmp_path.glob("started.*"))
        assert not any(alive(pid) for pid in first)  # SIGKILLed, not left stopped
        # torch's own restart count did not move: the agent's budget was given the restart back.
        assert {(tmp_path / f"restart-count.{r}").read_text() for r in (0, 1)} == {"0"}
        worker = list_live_workers(session, run_id)["0"]
        assert worker.exited and worker.rank_restarts == 1, worker
        assert worker.rank_restart_reason.startswith("restart in place requested by the operator for generation 2")
