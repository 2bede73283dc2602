"""The private torch internals behind flywheel/torch_compat.py still exist with the signatures the seams
expect, and the seams still work. A failure here after a torch upgrade means: read the new torch's source for each
seam named in torch_compat.py, adapt it, then move TESTED_TORCH."""

from __future__ import annotations

import inspect
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

from flywheel import torch_compat

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_torch_is_the_version_the_seams_were_read_against() -> None:
    assert torch.__version__.startswith(torch_compat.TESTED_TORCH + "."), (
        f"torch {torch.__version__} is not {torch_compat.TESTED_TORCH}.x: re-check every seam in "
        "flywheel/torch_compat.py against its source, then update TESTED_TORCH")


@pytest.mark.parametrize("attribute", torch_compat.AGENT_ATTRIBUTES)
def test_the_elastic_agent_still_sets_the_attributes_we_read(attribute: str) -> None:
    init_sources = "".join(inspect.getsource(cls.__init__) for cls in LocalElasticAgent.__mro__
                           if "__init__" in vars(cls) and cls.__module__.startswith("torch."))
    assert f"self.{attribute} =" in init_sources or f"self.{attribute}:" in init_sources, (
        f"LocalElasticAgent no longer sets {attribute} (flywheel/torch_compat.py reads it)")


def test_the_agent_seams_read_and_set_those_attributes() -> None:
    class Agent:
        _pcontext, _shutdown_timeout, _remaining_restarts = "ctx", 42, 3
        stopped_with: int | None = None

        def _shutdown(self, timeout: int) -> None:
            self.stopped_with = timeout

    agent = Agent()
    assert torch_compat.agent_process_context(agent) == "ctx"
    torch_compat.stop_agent_ranks(agent)
    assert agent.stopped_with == 42
    torch_compat.stop_agent_ranks(agent, 2)
    assert agent.stopped_with == 2
    torch_compat.forbid_agent_restarts(agent)
    assert agent._remaining_restarts == 0


def test_the_installed_torch_has_every_seam_the_launcher_checks_at_start() -> None:
    """The hooks launch.py overrides keep their signatures, and the agent takes a shutdown_timeout (one check, the
    one `flywheel launch` runs at start)."""
    assert torch_compat.agent_seam_problems() == []


def test_the_start_up_check_names_a_changed_hook_and_a_missing_argument(monkeypatch) -> None:
    class OlderAgent:  # the shape torch 2.11's LocalElasticAgent has (seen on a lent H200)
        def __init__(self, spec, logs_specs, start_method="spawn", exit_barrier_timeout=300) -> None: ...

        def _shutdown(self, death_sig) -> None: ...

    for hook in torch_compat.AGENT_HOOKS:
        if hook != "_shutdown":
            setattr(OlderAgent, hook, getattr(LocalElasticAgent, hook))
    monkeypatch.setattr("torch.distributed.elastic.agent.server.local_elastic_agent.LocalElasticAgent", OlderAgent)
    problems = torch_compat.agent_seam_problems()
    assert len(problems) == 2
    assert "_shutdown(self, death_sig, timeout)" in problems[0] and "takes no shutdown_timeout" in problems[1]


def test_the_process_context_close_keeps_its_signature() -> None:
    from torch.distributed.elastic.multiprocessing.api import PContext

    assert tuple(inspect.signature(PContext.close).parameters) == ("self", "death_sig", "timeout")


@pytest.mark.parametrize("name", sorted(torch_compat.PRIVATE_IMPORTS))
def test_the_private_functions_still_import(name: str) -> None:
    assert callable(getattr(torch_compat, name))


def test_an_unknown_seam_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_seam"):
        getattr(torch_compat, "no_such_seam")


def test_private_function_signatures() -> None:
    params = inspect.signature(torch_compat.all_to_all_single_autograd).parameters
    assert tuple(params)[:4] == ("self", "output_split_sizes", "input_split_sizes", "group")
    assert tuple(inspect.signature(torch_compat.set_pg_timeout).parameters) == ("timeout", "group")
    wrapper = tuple(inspect.signature(torch_compat.checkpoint_wrapper).parameters)
    assert wrapper[0] == "module" and wrapper[-1] == "checkpoint_fn_kwargs"  # preserve_rng_state goes through


def test_mesh_unflatten_and_dtensor_seams_on_one_gloo_rank(tmp_path) -> None:
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=30))
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard

        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
        unflat = torch_compat.unflatten_mesh(mesh, 0, (1, 1), ("edp", "ep"))
        assert unflat.mesh_dim_names == ("edp", "ep") and unflat.shape == (1, 1)
        dt = DTensor.from_local(torch.arange(4.0), mesh, [Shard(0)])
        local = torch_compat.dtensor_local(dt)
        assert torch.equal(local, torch.arange(4.0)) and local.grad_fn is None
        swapped = torch_compat.dtensor_with_local(torch.ones(4), dt)
        assert isinstance(swapped, DTensor) and swapped.placements == dt.placements
        assert torch.equal(swapped.to_local(), torch.ones(4)) and not swapped.requires_grad
        torch_compat.set_pg_timeout(timedelta(seconds=20), None)
    finally:
        dist.destroy_process_group()


def test_the_rendezvous_still_numbers_agents_by_sorting_generated_node_descriptors() -> None:
    import dataclasses

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    assert "cls._node_desc_generator.generate(local_addr)" in inspect.getsource(
        rdzv.DynamicRendezvousHandler.from_backend), "rank_order.py swaps the generator through this class attribute"
    assert "enumerate(sorted(state.participants))" in inspect.getsource(rdzv), (
        "ranks are no longer assigned by sorting the participants: re-check agent/rank_order.py")
    assert [f.name for f in dataclasses.fields(rdzv._NodeDesc)] == ["addr", "pid", "local_id"]
    assert tuple(inspect.signature(rdzv._get_timeout).parameters) == ("params", "key")


def test_a_dead_agents_rendezvous_heartbeat_is_expired_and_torch_then_drops_it() -> None:
    """agent/rendezvous/expiry.py rewrites `_RendezvousState.last_heartbeats` and relies on torch's `_sanitize`
    dropping a participant whose heartbeat is older than keep_alive_interval x keep_alive_max_attempt."""
    import pickle
    from datetime import datetime, timezone

    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    from flywheel.agent.rank_order import ReplicaOrderedNode
    from flywheel.agent.rendezvous.expiry import EXPIRED, expire_local_agent

    assert "last_heartbeat < expire_time" in inspect.getsource(rdzv._BackendRendezvousStateHolder._sanitize)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    backend = C10dRendezvousBackend(store, "job")
    alive, dead = ReplicaOrderedNode("127.0.0.1", 100, 0, 0), ReplicaOrderedNode("127.0.0.1", 200, 0, 1)
    state = rdzv._RendezvousState()
    now = datetime.now(timezone.utc)
    state.participants = {alive: 0, dead: 1}
    state.last_heartbeats = {alive: now, dead: now}
    assert backend.set_state(pickle.dumps(state), None) is not None
    assert expire_local_agent(store, "job", 200) == 1
    assert expire_local_agent(store, "job", 200) == 0  # already expired: nothing written
    current = backend.get_state()
    assert current is not None
    after = pickle.loads(current[0])
    assert after.last_heartbeats == {alive: now, dead: EXPIRED} and after.participants == {alive: 0, dead: 1}


def test_a_stopped_agent_leaves_its_rendezvous_round_without_closing_it() -> None:
    """launch.py: an agent stopped by SIGTERM runs torch's exit op (torch_compat.leave_rendezvous): it is no longer
    a participant, so the others' next round need not wait for its heartbeat to expire; the rendezvous stays open."""
    import pickle

    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    assert "exit_op = _RendezvousExitOp()" in inspect.getsource(rdzv.DynamicRendezvousHandler.next_rendezvous)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    backend = C10dRendezvousBackend(store, "leave")
    handler = rdzv.DynamicRendezvousHandler.from_backend("leave", store, backend, min_nodes=1, max_nodes=1)
    handler.next_rendezvous()  # a round of one: this agent is its participant
    joined = pickle.loads(backend.get_state()[0])  # type: ignore[index]
    assert list(joined.participants) == [handler._this_node]
    torch_compat.leave_rendezvous(handler, 5.0)
    left = pickle.loads(backend.get_state()[0])  # type: ignore[index]
    assert handler._this_node not in left.participants and not left.closed


def test_a_regrouping_round_closes_when_the_last_group_is_back_and_keeps_the_last_call_otherwise() -> None:
    """agent/rendezvous/regroup.py: with min 1 < max 3, a round closes once every participant of the last
    completed round rejoined (no last call); a first round, a round missing one of them, or one with an agent on
    the wait list keeps torch's last call. Seams: torch's executor methods and the handler attributes swapped."""
    import pickle
    import time

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    from flywheel.agent.rank_order import ReplicaOrderedNode
    from flywheel.agent.rendezvous.regroup import FORMED, RegroupingOpExecutor, regroup_early, regrouped

    source = inspect.getsource(rdzv.DynamicRendezvousHandler.__init__)
    assert "self._op_executor = _DistributedRendezvousOpExecutor(" in source
    for name in ("_add_to_participants", "_mark_rendezvous_complete"):
        assert name in inspect.getsource(rdzv._DistributedRendezvousOpExecutor)

    a, b = ReplicaOrderedNode("h", 1, 0, 0), ReplicaOrderedNode("h", 2, 0, 1)
    state = rdzv._RendezvousState()
    state.participants = {a: 0}
    assert not regrouped(state)  # a first round: no group formed yet
    setattr(state, FORMED, frozenset({a, b}))
    assert not regrouped(state)  # b is not back
    state.participants[b] = 0
    assert regrouped(state)
    state.wait_list = {ReplicaOrderedNode("h", 3, 0, 2)}
    assert not regrouped(state)  # an agent waits to scale up: the last call lets it in

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)

    def rounds(run_id: str, regroup: bool, last_call: float) -> tuple[float, float]:
        """Seconds of a first round and of the next (a restart in place) for one agent."""
        backend = C10dRendezvousBackend(store, run_id)
        handler = rdzv.DynamicRendezvousHandler.from_backend(
            run_id, store, backend, min_nodes=1, max_nodes=3,
            timeout=rdzv.RendezvousTimeout(last_call=timedelta(seconds=last_call)))
        if regroup:
            regroup_early(handler)
            assert isinstance(handler._op_executor, RegroupingOpExecutor)
        took = []
        for _ in range(2):
            began = time.monotonic()
            handler.next_rendezvous()
            took.append(time.monotonic() - began)
        formed = pickle.loads(backend.get_state()[0]).__dict__.get(FORMED)  # type: ignore[index]
        assert formed == ({handler._this_node} if regroup else None)
        return took[0], took[1]

    plain_first, plain_next = rounds("plain", regroup=False, last_call=3.0)
    assert plain_first >= 2.7 and plain_next >= 2.7  # torch's last call
    # The same group re-formed: no last call. A round's own store round trips took up to 1.1 s, and over 2 s with
    # three busy processes on two cores: a long last call keeps the two apart.
    first, regrouped_next = rounds("regroup", regroup=True, last_call=8.0)
    assert first >= 7.7 and regrouped_next < 5.0, (first, regrouped_next)


def test_a_group_that_lost_a_member_is_told_from_one_whose_round_is_whole() -> None:
    """launch.py stops a healthy group with a short grace when a member of its round is gone (its ranks are blocked
    in a collective with it): torch keeps a complete round complete when `_sanitize` drops a dead participant."""
    import pickle
    import threading
    from datetime import datetime, timedelta, timezone
    from types import SimpleNamespace

    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    from flywheel.agent.rank_order import ReplicaOrderedNode

    assert "self._heartbeat_lock = threading.Lock()" in inspect.getsource(rdzv.DynamicRendezvousHandler.__init__)
    assert "if state.complete:" in inspect.getsource(rdzv._remove_participant_epilogue)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    backend = C10dRendezvousBackend(store, "lost")
    a, b = ReplicaOrderedNode("127.0.0.1", 100, 0, 0), ReplicaOrderedNode("127.0.0.1", 200, 0, 1)
    state = rdzv._RendezvousState()
    now = datetime.now(timezone.utc)
    state.complete, state.participants, state.last_heartbeats = True, {a: 0, b: 1}, {a: now, b: now}
    assert backend.set_state(pickle.dumps(state), None) is not None
    settings = rdzv.RendezvousSettings("lost", 2, 2, rdzv.RendezvousTimeout(), timedelta(seconds=5), 3)
    holder = rdzv._BackendRendezvousStateHolder(backend, settings, cache_duration=0)
    agent = SimpleNamespace(_rdzv_handler=SimpleNamespace(_state_holder=holder, _heartbeat_lock=threading.Lock()))
    assert not torch_compat.group_lost_a_member(agent, 2)
    token = backend.get_state()[1]  # type: ignore[index]
    state.last_heartbeats[b] = datetime(1970, 1, 1, tzinfo=timezone.utc)  # b's node is lost
    assert backend.set_state(pickle.dumps(state), token) is not None
    assert torch_compat.group_lost_a_member(agent, 2)
    assert not torch_compat.group_lost_a_member(SimpleNamespace(_rdzv_handler=object()), 2)


def test_the_rendezvous_poll_interval_replaces_only_torchs_one_second_state_poll(monkeypatch) -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    assert "_delay(seconds=1)" in inspect.getsource(rdzv._DistributedRendezvousOpExecutor.run)
    slept: list[object] = []
    monkeypatch.setattr(rdzv, "_delay", lambda seconds: slept.append(seconds))
    torch_compat.set_rendezvous_poll_interval(0.25)
    torch_compat.set_rendezvous_poll_interval(0.25)  # again (a second handler): still one wrapper
    rdzv._delay(seconds=1)
    rdzv._delay(seconds=(0, 0.3))
    assert slept == [0.25, (0, 0.3)]


def test_the_rendezvous_state_cache_is_the_holders_cache_duration() -> None:
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    assert "self._cache_duration = cache_duration" in inspect.getsource(rdzv._BackendRendezvousStateHolder.__init__)
    assert "self._cache_duration" in inspect.getsource(rdzv._BackendRendezvousStateHolder.sync)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    handler = rdzv.DynamicRendezvousHandler.from_backend("cache", store, C10dRendezvousBackend(store, "cache"), 1, 1)
    torch_compat.set_rendezvous_state_cache(handler, 0.25)
    assert handler._state_holder._cache_duration == 0.25


class _BarrierAgent:
    """The attributes `wait_exit_barrier` reads, over a real store."""

    def __init__(self, store, world_size: int, timeout: float) -> None:
        self._store, self._exit_barrier_timeout, self._in_exit_barrier = store, timeout, False
        self._worker_group = type("Group", (), {"group_world_size": world_size})()


def test_the_exit_barrier_meets_torch_agents_times_out_and_lets_a_signal_through() -> None:
    """Agents meet in torch's own barrier keys; an agent alone returns at the timeout; and a SIGTERM while it
    waits raises at once (torch's one blocking store wait held it until the timeout: 300 s by default)."""
    import signal
    import threading
    import time

    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.utils.store import barrier

    store = dist.HashStore()
    peer = threading.Thread(target=barrier, args=(store, 2, "torchelastic/agent/terminal_state"))
    peer.start()
    torch_compat.wait_exit_barrier(_BarrierAgent(store, 2, 5.0))  # met torch's own barrier
    peer.join(5)
    assert not peer.is_alive()

    alone = _BarrierAgent(dist.HashStore(), 2, 0.6)
    start = time.monotonic()
    torch_compat.wait_exit_barrier(alone)
    assert 0.6 <= time.monotonic() - start < 3 and not alone._in_exit_barrier

    def raise_signal(signum, _frame):
        raise SignalException("stop", sigval=signal.Signals(signum))

    previous = signal.signal(signal.SIGALRM, raise_signal)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        start = time.monotonic()
        with pytest.raises(SignalException):
            torch_compat.wait_exit_barrier(_BarrierAgent(dist.HashStore(), 2, 60.0))
        assert time.monotonic() - start < 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
