"""Ranks follow the replica index at any size: 12 agents joining in a shuffled order, with host names whose string
order differs from their numeric order, against a real etcd (and the local runner's c10d store). The handler tests
check the agents' group ranks; the `flywheel launch` tests check every process's global rank with 2 per replica."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, _NodeDesc

import flywheel.agent.rendezvous.handler  # noqa: F401  (registers the etcd-v3 handler)
from flywheel.agent.rank_order import UNORDERED, ReplicaOrderedNode, create_ordered_c10d_handler, replica_order
from flywheel.agent.rendezvous import handler as etcd_handler
from flywheel.local.runner import _host_store
from flywheel.operator.manifests import OperatorSettings
from flywheel.operator.manifests import plan as operator_plan
from flywheel.spec import API_VERSION, TrainingJob, parse_job
from flywheel.worker_plan import Placement, WorkerPlan, plan_workers

from .etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(120)


def test_replica_order_reads_an_index_or_the_number_ending_a_host_name() -> None:
    assert [replica_order(r) for r in ("0", "7", "12", "job-worker-10", " 3 ")] == [0, 7, 12, 10, 3]
    assert replica_order("worker") == UNORDERED


def test_nodes_sort_by_replica_before_address_and_pid() -> None:
    nodes = [ReplicaOrderedNode(f"job-worker-{i}.svc", 100 - i, 0, i) for i in (10, 2, 1, 11, 0)]
    assert [n.replica for n in sorted(nodes)] == [0, 1, 2, 10, 11]
    assert sorted(_NodeDesc(n.addr, n.pid, 0) for n in nodes)[0].addr == "job-worker-0.svc"
    assert sorted(_NodeDesc(n.addr, n.pid, 0) for n in nodes)[1].addr == "job-worker-1.svc"
    assert sorted(_NodeDesc(n.addr, n.pid, 0) for n in nodes)[2].addr == "job-worker-10.svc"  # torch's own order
    same_host = [ReplicaOrderedNode("127.0.0.1", pid, 0, i) for i, pid in enumerate((900, 300, 600))]
    assert [n.replica for n in sorted(same_host)] == [0, 1, 2]  # not by pid
    unindexed = ReplicaOrderedNode("b", 1, 0)
    assert sorted([unindexed, nodes[0]])[-1] is unindexed


def join_all(handlers: dict[int, DynamicRendezvousHandler]) -> dict[int, tuple[int, int]]:
    ranks = {}

    def join(index: int) -> None:
        info = handlers[index].next_rendezvous()
        ranks[index] = (info.rank, info.world_size)

    threads = [threading.Thread(target=join, args=(i,)) for i in handlers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    for handler in handlers.values():
        handler.shutdown()
    return ranks


def test_twelve_agents_get_ranks_in_replica_order(etcd_server: EtcdServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each etcd handler releases its liveness lease at interpreter exit (an agent's life); here they are released
    # while etcd still runs, not by pytest's exit against a stopped server (5 s read timeout each).
    releases: list[Callable[[], None]] = []
    monkeypatch.setattr(etcd_handler, "atexit", SimpleNamespace(register=releases.append))
    try:
        _join_twelve_etcd_agents(etcd_server)
    finally:
        for release in releases:
            release()


def _join_twelve_etcd_agents(etcd_server: EtcdServer) -> None:
    size, handlers = 12, {}
    for index in random.Random(5).sample(range(size), size):  # created and joined in a shuffled order
        handlers[index] = rendezvous_handler_registry.create_handler(RendezvousParameters(
            backend="etcd-v3", endpoint=etcd_server.endpoint, run_id="job-order", min_nodes=size, max_nodes=size,
            local_addr=f"job-worker-{index}", replica_id=str(index), worker_ttl=5, last_call_timeout=1,
            join_timeout=60))
    assert join_all(handlers) == {i: (i, size) for i in range(size)}


def test_twelve_local_agents_on_one_address_get_ranks_in_replica_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local runner's c10d rendezvous: every replica on 127.0.0.1, which torch orders by pid."""
    size, handlers = 12, {}
    host = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for index in random.Random(7).sample(range(size), size):
        monkeypatch.setenv("FLYWHEEL_REPLICA_INDEX", str(index))
        handlers[index] = create_ordered_c10d_handler(RendezvousParameters(
            backend="c10d", endpoint=f"127.0.0.1:{host.port}", run_id="local-order", min_nodes=size,
            max_nodes=size, local_addr="127.0.0.1", is_host=False, last_call_timeout=1, join_timeout=60))
    assert join_all(handlers) == {i: (i, size) for i in range(size)}


SIZE, PROCS = 12, 2
REPO = Path(__file__).resolve().parents[2]
RECORD_RANK = Path(__file__).with_name("record_rank.py")


def rank_order_job(out_dir: Path) -> TrainingJob:
    """12 replicas x 2 ranks of a user command that only records who each rank became."""
    return parse_job({"apiVersion": API_VERSION, "kind": "TrainingJob", "metadata": {"name": "rank-order"},
                      "spec": {"replicas": {"min": SIZE, "max": SIZE}, "procsPerReplica": PROCS,
                               "command": [str(RECORD_RANK), str(out_dir)]}})


def launch_all(plans: Sequence[WorkerPlan], order: Sequence[int], logs: Path,
               extra_env: Mapping[int, Mapping[str, str]] | None = None, timeout: float = 180) -> None:
    """Start one `flywheel launch` per plan (argv and contract env as the executor gives them), in `order`, each in
    its own process group; wait for all of them to exit 0. The first agent to fail is reported at once (the others
    would wait for it in the rendezvous); on a timeout, every agent still running dumps its threads' stacks into its
    log (faulthandler, on SIGABRT) before it is killed."""
    assert sorted(order) == [p.index for p in plans] and list(order) != sorted(order)
    agents: dict[int, subprocess.Popen[bytes]] = {}
    try:
        for index in order:
            plan = plans[index]
            argv = [sys.executable if plan.argv[0] == "python" else plan.argv[0], *plan.argv[1:]]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1",
                   **plan.env, **(extra_env or {}).get(index, {})}
            with open(logs / f"agent{index}.log", "wb") as log:
                agents[index] = subprocess.Popen(argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                                 start_new_session=True)
        _wait_all(agents, logs, time.monotonic() + timeout)
    finally:
        for agent in agents.values():
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()


def _wait_all(agents: Mapping[int, subprocess.Popen[bytes]], logs: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        codes = {index: agent.poll() for index, agent in agents.items()}
        failed = [index for index, code in codes.items() if code not in (None, 0)]
        if failed:
            pytest.fail(f"agent {failed[0]} exited {codes[failed[0]]} (exit codes {codes}):\n"
                        f"{agent_log(logs, failed[0])}")
        if all(code == 0 for code in codes.values()):
            return
        time.sleep(0.5)
    running = [index for index, agent in agents.items() if agent.poll() is None]
    for index in running:
        os.kill(agents[index].pid, signal.SIGABRT)
    for index in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            agents[index].wait(5)
    pytest.fail(f"agents {running} still running after the timeout (exit codes "
                f"{ {i: a.returncode for i, a in agents.items()} }); agent {running[0]}'s log:\n"
                f"{agent_log(logs, running[0])}")


def agent_log(logs: Path, index: int) -> str:
    return (logs / f"agent{index}.log").read_text(errors="replace")[-6000:]


def assert_ranks_follow_replicas(plans: Sequence[WorkerPlan], out_dir: Path) -> None:
    seen = {(int(r["FLYWHEEL_REPLICA_INDEX"]), int(r["LOCAL_RANK"])): r
            for r in (json.loads(p.read_text()) for p in out_dir.glob("*.json"))}
    assert sorted(seen) == [(i, local) for i in range(SIZE) for local in range(PROCS)]
    for (index, local), record in sorted(seen.items()):
        assert int(record["RANK"]) == index * PROCS + local, record
        assert plans[index].first_rank <= int(record["RANK"]) <= plans[index].last_rank  # what the plan promised
        assert (int(record["GROUP_RANK"]), int(record["WORLD_SIZE"])) == (index, SIZE * PROCS), record


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_twelve_launched_workers_on_a_cluster_rank_every_process_by_replica(etcd_server: EtcdServer,
                                                                            tmp_path: Path) -> None:
    """The operator's plan through the etcd backend: each agent's address is its pod's name (torch's getfqdn() on a
    cluster), which sorts as `...worker-1`, `...worker-10`, `...worker-11`, `...worker-2`."""
    out = tmp_path / "ranks"
    out.mkdir()
    plans = operator_plan(rank_order_job(out), uuid.uuid4().hex, OperatorSettings(etcd_endpoints=etcd_server.endpoint),
                          None)
    hostnames = [p.hostname for p in plans]
    assert sorted(hostnames) != hostnames and hostnames[10] < hostnames[2]
    launch_all(plans, random.Random(11).sample(range(SIZE), SIZE), tmp_path,
               {p.index: {"PET_LOCAL_ADDR": p.hostname} for p in plans})
    assert_ranks_follow_replicas(plans, out)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_twelve_launched_local_workers_rank_every_process_by_replica(tmp_path: Path) -> None:
    """`flywheel run`'s plan through the c10d store it hosts: every agent on 127.0.0.1, started in a shuffled order
    (so that their pids, torch's own tie-break, do not follow the replica index)."""
    out = tmp_path / "ranks"
    out.mkdir()
    store = _host_store()
    placement = Placement(replicas=SIZE, rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{store.port}",
                          master_addr="127.0.0.1", master_port=store.port, checkpoint_dir=str(tmp_path / "ckpt"),
                          launcher=(sys.executable, "-m", "flywheel.cli", "launch"))
    plans = plan_workers(rank_order_job(out), placement)
    launch_all(plans, random.Random(13).sample(range(SIZE), SIZE), tmp_path)
    assert_ranks_follow_replicas(plans, out)
