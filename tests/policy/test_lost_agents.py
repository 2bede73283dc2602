"""policy/lost_agents.py: which agents a pass gave up on (their rendezvous heartbeats are expired at once)."""

from __future__ import annotations

from dataclasses import replace

from flywheel.policy.decisions import CreatePod, DeletePod, PromoteSpare, Relabel
from flywheel.policy.lost_agents import agent_host, lost_agents
from flywheel.policy.observed import PodView


def pod(name: str, index: int, generation: int = 1, role: str = "worker") -> PodView:
    return PodView(name=name, uid=f"uid-{name}", index=index, generation=generation, phase="Running", role=role)


def test_a_restart_gives_up_on_the_failed_and_deleted_workers_not_on_survivors_or_spares() -> None:
    pods = [pod("j-worker-0", 0), pod("j-worker-1", 1), pod("j-worker-2", 2), pod("j-spare-0", -1, role="spare")]
    actions = [DeletePod("j-worker-1", "uid-j-worker-1"), Relabel("j-worker-0", 2), Relabel("j-worker-2", 2),
               PromoteSpare("j-spare-0", 1, 2)]
    assert lost_agents(pods, 1, 2, actions) == ["j-worker-1"]


def test_a_worker_already_terminating_when_the_restart_is_decided_is_given_up_on() -> None:
    # A deleted pod (Terminating) gets no DeletePod: the restart's generation leaves it behind.
    pods = [pod("j-worker-0", 0), pod("j-worker-1", 1)]
    assert lost_agents(pods, 1, 2, [Relabel("j-worker-0", 2), CreatePod(1, 2)]) == ["j-worker-1"]


def test_no_restart_and_no_delete_expires_nobody() -> None:
    pods = [pod("j-worker-0", 0), pod("j-worker-1", 1)]
    assert lost_agents(pods, 1, 1, [Relabel("j-worker-1", 1)]) == []
    assert lost_agents(pods, 1, 1, [DeletePod("j-spare-3", "u")]) == []


def test_the_agent_host_is_the_pod_name_of_its_fqdn() -> None:
    assert agent_host("j-worker-1.j-workers.default.svc") == "j-worker-1"
    assert agent_host("j-worker-1") == "j-worker-1"


def test_an_agent_is_told_by_its_keys_host_pid_and_replica_else_by_its_pod_name() -> None:
    from flywheel.policy.lost_agents import AgentId, is_agent

    known = AgentId("j-worker-1", 1, "j-worker-1", 7)
    assert is_agent("j-worker-1.j-workers.ns.svc", 7, 1, known)
    assert not is_agent("j-spare-0.j-workers.ns.svc", 7, 1, known)  # a promoted spare of the same pid
    assert not is_agent("j-worker-1.j-workers.ns.svc", 8, 1, known)  # a new pod of the name
    shared = AgentId("j-worker-1", 1, "machine", 4242)  # pods that are processes of one machine
    assert is_agent("machine.local", 4242, 1, shared) and not is_agent("machine.local", 4243, 1, shared)
    assert not is_agent("machine.local", 4242, 0, shared)
    assert is_agent("localhost", 4242, 1, shared)  # getfqdn() of a machine without a domain
    assert not is_agent("other-pod.j-workers.ns.svc", 4242, 1, shared)
    assert is_agent("j-worker-1.j-workers.ns.svc", 1, 1, AgentId("j-worker-1"))
    assert not is_agent("machine", 1, 1, AgentId("j-worker-1"))


def test_the_operator_remembers_a_pods_agent_past_its_keys_expiry() -> None:
    from types import SimpleNamespace

    from flywheel.operator.rendezvous_expiry import AgentMemory
    from flywheel.policy.lost_agents import AgentId

    memory, view = AgentMemory(), pod("j-worker-1", 1)
    memory.remember(view, None)  # no key of its own yet (a predecessor's or none)
    assert memory.of(["j-worker-1"]) == [AgentId("j-worker-1")]
    memory.remember(view, SimpleNamespace(since=11.0, host="h", pid=9))
    memory.remember(view, None)  # the key expired (a lost node), or is a replacement's: still known
    assert memory.of(["j-worker-1"]) == [AgentId("j-worker-1", 1, "h", 9)]
    memory.keep(set())
    assert memory.of(["j-worker-1"]) == [AgentId("j-worker-1")]


def test_a_replicas_liveness_key_belongs_to_the_newest_pod_that_existed_when_it_was_written() -> None:
    """A lost worker still being deleted and the spare promoted to its index share the index's key: it is the
    spare's. Read as the lost pod's, the operator remembered the spare's agent under the lost pod's name and expired
    it in the rendezvous, which shrank the new group below its minimum (bench/goodput_operator, lose-node)."""
    from types import SimpleNamespace

    from flywheel.operator.etcd_views import key_owners

    lost, spare, other = pod("j-worker-1", 1), pod("j-spare-0", 1), pod("j-worker-0", 0)
    lost, spare, other = (replace(v, uid=v.name) for v in (lost, spare, other))
    workers = [(lost, 10.0), (spare, 50.0), (other, 10.0)]
    key = SimpleNamespace(since=50.5, host="h", pid=9)
    assert key_owners(workers, {"1": key}) == {1: "j-spare-0"}
    assert key_owners(workers, {"1": SimpleNamespace(since=20.0)}) == {1: "j-worker-1"}  # before the promotion
    assert key_owners(workers, {"1": SimpleNamespace(since=5.0)}) == {}  # a predecessor's of both
    assert key_owners(workers, {"0": SimpleNamespace(since=12.0)}) == {0: "j-worker-0"}
    assert key_owners(workers, None) == {}
