"""Every private torch internal Flywheel relies on, named in one place. Each one is checked against the installed
torch by tests/test_torch_compat.py, which fails loudly on a torch upgrade: re-check the seams below against
the new torch's source, then move TESTED_TORCH.

- LocalElasticAgent (torch.distributed.elastic): `flywheel launch`'s agent overrides the hooks in AGENT_HOOKS and
  reads or sets `_pcontext` (the ranks' process context, to shorten the grace of a failure-triggered close),
  `_shutdown`/`_shutdown_timeout` (stop the ranks with a chosen grace and signal), `_remaining_restarts` (no
  restart after a USER_ERROR exit; one given back for a restart in place the operator asked for).
- DynamicRendezvousHandler's node descriptors (`_NodeDesc`, `_NodeDescGenerator`, the class attribute
  `_node_desc_generator` that `from_backend` generates the joining node with) and `_get_timeout`: the etcd-v3
  handler joins with a descriptor that sorts by replica index (agent/rank_order.py).
- DynamicRendezvousHandler's state (`_RendezvousState`, pickled by the backend; its `last_heartbeats` by node):
  the local supervisor expires a dead agent's heartbeat so that the next round need not wait for it
  (agent/rendezvous/expiry.py).
- DynamicRendezvousHandler's `_stop_heartbeats`, `_op_executor` and torch's `_RendezvousExitOp` (what
  `next_rendezvous` runs first): an agent stopped by SIGTERM leaves the rendezvous round it took part in, so the
  next round need not wait for its heartbeat to expire (launch.py; drain ahead, a deleted pod).
- DynamicRendezvousHandler's `_op_executor`, `_this_node`, `_state_holder`, `_settings`, and
  `_DistributedRendezvousOpExecutor`'s `_add_to_participants`/`_mark_rendezvous_complete`/`_state`: a round closes
  as soon as the last group's agents have all rejoined (agent/rendezvous/regroup.py).
- The agent's exit barrier (`_exit_barrier`, `_store`, `_worker_group`, `_exit_barrier_timeout`,
  `_in_exit_barrier`; torch's `_barrier_nonblocking` and `_TERMINAL_STATE_SYNC_ID`): polled, so a SIGTERM is
  handled while it waits (`wait_exit_barrier`).
- DeviceMesh._unflatten: the dp dimension viewed as (edp, ep) for expert parallelism.
- DTensor's `_local_tensor`/`_spec` and its constructor: checkpoint staging swaps a CPU shard into a DTensor
  without moving it back to the mesh's device (DTensor.from_local would), as DCP's own staging does.
- Private functions (PRIVATE_IMPORTS), imported lazily through this module so that `flywheel launch` does not pay
  for them: `all_to_all_single_autograd` (differentiable all-to-all of the MoE dispatch), `checkpoint_wrapper`
  (activation checkpointing of a block), `_set_pg_timeout` (shorten the collective timeout after the first step:
  the public API sets it only at init_process_group).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.elastic.multiprocessing.api import PContext

TESTED_TORCH = "2.13"  # the torch minor version these seams were read against (pyproject pins torch 2.13.x)

# The LocalElasticAgent methods agent.FlywheelAgent overrides, with the parameters it expects.
AGENT_HOOKS = {"_start_workers": ("self", "worker_group"), "_stop_workers": ("self", "worker_group"),
               "_monitor_workers": ("self", "worker_group"), "_restart_workers": ("self", "worker_group"),
               "_shutdown": ("self", "death_sig", "timeout"), "_exit_barrier": ("self",)}
# The agent attributes read or set here (set by LocalElasticAgent/SimpleElasticAgent.__init__).
AGENT_ATTRIBUTES = ("_pcontext", "_shutdown_timeout", "_remaining_restarts", "_rdzv_handler", "_store",
                    "_worker_group", "_exit_barrier_timeout", "_in_exit_barrier")
PRIVATE_IMPORTS = {
    "all_to_all_single_autograd": ("torch.distributed._functional_collectives", "all_to_all_single_autograd"),
    "checkpoint_wrapper": ("torch.distributed.algorithms._checkpoint.checkpoint_wrapper", "checkpoint_wrapper"),
    "set_pg_timeout": ("torch.distributed.distributed_c10d", "_set_pg_timeout"),
}


def agent_seam_problems() -> list[str]:
    """What `flywheel launch` needs of the installed torch's elastic agent and does not find there (empty: all is
    there). Checked at start-up, so another torch fails with this list rather than a TypeError mid-start."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    problems = []
    for hook, params in AGENT_HOOKS.items():
        method = getattr(LocalElasticAgent, hook, None)
        found = tuple(inspect.signature(method).parameters) if callable(method) else None
        if found != params:
            problems.append(f"LocalElasticAgent.{hook}({', '.join(params)}) is {hook}{found or ' missing'}")
    if "shutdown_timeout" not in inspect.signature(LocalElasticAgent.__init__).parameters:
        problems.append("LocalElasticAgent() takes no shutdown_timeout")
    return problems


def agent_process_context(agent: Any) -> PContext | None:
    """The PContext of the agent's running ranks (None before the first start)."""
    context: PContext | None = agent._pcontext
    return context


def stop_agent_ranks(agent: Any, timeout: int | None = None) -> None:
    """Stop the agent's ranks: SIGTERM, then SIGKILL after `timeout` s (default: the agent's shutdown_timeout)."""
    agent._shutdown(timeout=agent._shutdown_timeout if timeout is None else timeout)


KILL_WAIT_SECONDS = 1  # how long `kill_agent_ranks` waits for the SIGKILLed ranks to be gone (they go in ms)


def kill_agent_ranks(agent: Any) -> None:
    """SIGKILL the agent's ranks now (each one's process group): no grace, for ranks that are hung or stopped."""
    agent._shutdown(death_sig=signal.SIGKILL, timeout=KILL_WAIT_SECONDS)


def group_lost_a_member(agent: Any, group_world_size: int | None) -> bool:
    """Whether the agent's last rendezvous round now has fewer participants than the group it formed: a member's
    heartbeat expired (or an executor expired it: its node is lost), and torch's `_sanitize` dropped it while
    keeping the round complete. False when that cannot be read (another handler, the backend unreachable)."""
    handler = getattr(agent, "_rdzv_handler", None)
    holder, lock = getattr(handler, "_state_holder", None), getattr(handler, "_heartbeat_lock", None)
    if holder is None or lock is None or not group_world_size:
        return False
    try:
        with lock:
            holder.sync()
            state = holder.state
            return bool(state.complete) and len(state.participants) < group_world_size
    except Exception:  # noqa: BLE001 - unknown: the caller keeps its default
        return False


def set_rendezvous_poll_interval(interval: float, wait: Callable[[float], None] | None = None) -> None:
    """torch's rendezvous op executor polls the backend state once a second while it waits for a round to change
    (`_delay(seconds=1)` in `_DistributedRendezvousOpExecutor.run`); a restart waits through up to two such polls
    (the waiting agent sees the new round, then the last joiner sees it complete). Poll every `interval` s instead in
    this process (the agent's), or `wait(interval)` (a wait a change of the state ends early: state_watch.py). The
    executor's other delays (its randomized back-off) are kept."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    original = getattr(dynamic_rendezvous._delay, "flywheel_original", dynamic_rendezvous._delay)

    def delay(seconds: float | tuple[float, float]) -> None:
        if seconds == 1 and wait is not None:
            wait(interval)
        else:
            original(interval if seconds == 1 else seconds)

    delay.flywheel_original = original  # type: ignore[attr-defined]
    dynamic_rendezvous._delay = delay


def set_rendezvous_state_cache(handler: Any, seconds: float) -> None:
    """The handler's state holder serves reads from a copy up to `cache_duration` (1 s) old: the agent's monitor
    (`num_nodes_waiting`) and every poll of a waiting join read it, so a joiner was noticed up to 1 s late."""
    handler._state_holder._cache_duration = seconds


def drop_rendezvous_state_cache(handler: Any) -> None:
    """The handler's next read of the rendezvous state goes to the backend (its cached copy is stale)."""
    handler._state_holder._last_sync_time = -1.0


def forbid_agent_restarts(agent: Any) -> None:
    """No more restarts of the ranks: the agent's run ends with the current failure."""
    agent._remaining_restarts = 0


def grant_agent_restart(agent: Any) -> None:
    """One more restart of the ranks: torch takes one from `max_restarts` for every restart after an unhealthy or
    failed group, including one the agent was asked for from outside."""
    agent._remaining_restarts += 1


def leave_rendezvous(handler: Any, seconds: float) -> None:
    """Take this agent out of the rendezvous participants (torch's own exit op), within `seconds`; its heartbeat
    stops. The rendezvous stays open for the others (unlike `shutdown`, which closes it)."""
    import time

    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousExitOp

    handler._stop_heartbeats()
    handler._op_executor.run(_RendezvousExitOp(), time.monotonic() + seconds)


EXIT_BARRIER_POLL_SECONDS = 0.25


def wait_exit_barrier(agent: Any) -> None:
    """torch's `_exit_barrier` (an agent whose ranks finished waits up to `exit_barrier_timeout` for the others),
    polled instead of its one blocking store wait: a signal's Python handler cannot run inside that wait, so in
    torch's the agent ignored SIGTERM (its pod's deletion, `flywheel run` stopping a worker) until the barrier ended.
    The barrier's keys are torch's (`_barrier_nonblocking` under its terminal-state prefix), so agents of either
    kind meet in it. A failing store ends the wait, logged, as in torch."""
    import time

    from torch.distributed.elastic.agent.server.api import _TERMINAL_STATE_SYNC_ID
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.utils.store import _barrier_nonblocking

    log = logging.getLogger(__name__)
    start = time.monotonic()
    agent._in_exit_barrier = True
    try:
        last = _barrier_nonblocking(store=agent._store, world_size=agent._worker_group.group_world_size,
                                    key_prefix=_TERMINAL_STATE_SYNC_ID)
        while not agent._store.check([last]):
            if time.monotonic() - start >= agent._exit_barrier_timeout:
                log.warning("the other agents did not finish within %s s", agent._exit_barrier_timeout)
                return
            time.sleep(EXIT_BARRIER_POLL_SECONDS)
    except SignalException:
        raise
    except Exception as err:  # noqa: BLE001 - as torch's: the agent's result stands
        log.warning("error waiting on the exit barrier after %.1f s: %s", time.monotonic() - start, err)
    finally:
        agent._in_exit_barrier = False


def unflatten_mesh(mesh: DeviceMesh, dim: int, sizes: tuple[int, ...], names: tuple[str, ...]) -> DeviceMesh:
    """Mesh dimension `dim` viewed as len(sizes) dimensions (row-major, the last innermost)."""
    return mesh._unflatten(dim, sizes, names)


def dtensor_local(tensor: Any) -> Any:
    """A DTensor's local shard, as it is (no copy, no autograd node; `to_local()` would add one)."""
    return tensor._local_tensor


def dtensor_with_local(local: Any, like: Any) -> Any:
    """A DTensor with `like`'s global shape, mesh and placements over `local`, wherever `local` lives."""
    from torch.distributed.tensor import DTensor

    build: Any = DTensor  # the private constructor (untyped): `from_local` would move `local` to the mesh's device
    return build(local, like._spec, requires_grad=False)


def __getattr__(name: str) -> Any:
    """The functions of PRIVATE_IMPORTS, imported on first use."""
    if name not in PRIVATE_IMPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = PRIVATE_IMPORTS[name]
    return getattr(importlib.import_module(module), attribute)
