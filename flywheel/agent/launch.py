"""`flywheel launch [-- user command...]`: torch's elastic agent configured from the worker contract env (PET_*).

One of these runs per worker (a Pod on a cluster, a process group under `flywheel run`). It starts
PET_NPROC_PER_NODE local ranks of `python -m flywheel.trainer` (or the user command), joins the rendezvous and lets
torch's LocalElasticAgent restart crashed ranks. Settings that make restarts fast and clean on this stack (measured,
docs/architecture.md): last_call_timeout 1 s, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (a fresh store per round avoids stale
gloo addresses), keep_alive_max_attempt >= 3 (2 allowed split brain).

Exit status (flywheel/contracts/exitcodes.py): 0 when every rank succeeded; otherwise the exit code of the first failing
rank (signal deaths as 128+N) so the executor's policy can classify it; STOPPED after SIGTERM/SIGINT.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from flywheel.agent import first_step, rank_restarts, spare_wait, warm, warm_entry
from flywheel.agent import workdir as agent_dir
from flywheel.agent.rendezvous import expiry as rendezvous_expiry
from flywheel.agent.settings import (
    TRAINER_MODULE,
    WARM_PRELOAD,
    LaunchConfigError,
    LaunchSettings,
    settings_from_env,
)
from flywheel.contracts import exitcodes, replica, termination_log

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.api import RunResult


# Exec'd in front of each rank's command: the rank dies with its agent (PR_SET_PDEATHSIG), as it would with its
# pod. torch starts every rank in its own session, so killing the agent's process group alone would orphan them.
_DIE_WITH_AGENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))\n"  # 1 = PR_SET_PDEATHSIG
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(128 + int(signal.SIGKILL))\n"  # the agent died before prctl took effect
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def _raise_signal_exception(signum: int, _frame: object) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException

    raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))


def _rank_entrypoint(command: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    if not sys.platform.startswith("linux"):
        return command[0], tuple(command[1:])
    setpriv = shutil.which("setpriv")  # util-linux: sets the death signal and execs, no interpreter start-up
    if setpriv:
        return setpriv, ("--pdeathsig", "KILL", "--", *command)
    return sys.executable, ("-c", _DIE_WITH_AGENT, str(os.getpid()), *command)


RANK_HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_hook")


def _report_user_exceptions(env: MutableMapping[str, str]) -> None:
    """A user command's Python ranks write an uncaught exception's reason to the termination message, as the
    embedded trainer does (rank_hook/sitecustomize.py, found through PYTHONPATH)."""
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [RANK_HOOK_DIR, env.get("PYTHONPATH")]))


def run_agent(settings: LaunchSettings) -> int:
    """Run the elastic agent until the ranks finish; return this process's exit code."""
    # Both are read by torch/the ranks from the environment; the workers inherit os.environ.
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    with agent_dir.agent_dir() as own:
        os.environ[first_step.ENV] = str(own / "stepped")  # the ranks' first step (first_step.py)
        if settings.warm_start and settings.runs_embedded_trainer:
            # Started first, so its import of the trainer overlaps the agent's own start-up and first rendezvous
            # (and, for a warm spare, happens before its promotion).
            with warm.zygote(preload=WARM_PRELOAD, folder=own) as zygote_env:
                os.environ.update(zygote_env)
                return _promoted_then(settings, zygote_env, warm.client_command(TRAINER_MODULE), own)
        _report_user_exceptions(os.environ)
        entry = warm_entry.python_entry(settings.command) if settings.warm_start else None
        if entry is None:
            return _promoted_then(settings, {}, settings.command, own)
        if entry.unbuffered:  # what `-u` did, for the forked ranks and for a client that falls back cold
            os.environ["PYTHONUNBUFFERED"] = "1"
        # A new interpreter in the ranks' environment (the exception hook on its path), which runs the user entry's
        # own imports of torch, transformers, ... once.
        with warm.zygote(preload=(), env=dict(os.environ), folder=own,
                         preload_code=warm_entry.preload_code(entry, os.getcwd())) as zygote_env:
            os.environ.update(zygote_env)
            return _promoted_then(settings, zygote_env, (*warm.client_command_for(entry.target), *entry.args), own)


def _promoted_then(settings: LaunchSettings, zygote_env: Mapping[str, str], command: Sequence[str],
                   own: Path) -> int:
    """Run the agent; a warm spare (FLYWHEEL_SPARE=1) first waits for its promotion (spare_wait.py) and then runs
    as the replica it became, with that replica's settings."""
    if replica.is_spare(os.environ):
        code = spare_wait.become_replica(settings.run_id, settings.rdzv_backend, settings.rdzv_endpoint, zygote_env)
        if code is not None:
            return code
        settings = dataclasses.replace(settings_from_env(os.environ), command=settings.command)
    return _run_agent(settings, command, own)


def _etcd_backend_registered(settings: LaunchSettings) -> bool:
    if settings.rdzv_backend != "etcd-v3":
        return True
    try:
        import flywheel.agent.rendezvous.handler  # noqa: F401  (registers the etcd-v3 handler)
    except ImportError as err:
        print(f"flywheel launch: etcd-v3 rendezvous is unavailable: {err}", file=sys.stderr)
        return False
    return True


def _run_agent(settings: LaunchSettings, command: Sequence[str], own: Path) -> int:
    if not _etcd_backend_registered(settings):
        return exitcodes.USER_ERROR
    # torch's elastic loggers take their level from LOGLEVEL when first imported: INFO for the agent (rendezvous
    # rounds and restarts belong in the worker log), the caller's setting for the ranks.
    with _loglevel_env("INFO"):
        import torch.distributed.elastic.rendezvous.registry as rdzv_registry
        from torch.distributed.elastic.agent.server.api import WorkerSpec
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent  # noqa: F401
        from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
        from torch.distributed.elastic.rendezvous import (  # noqa: F401
            RendezvousError,
            RendezvousParameters,
            c10d_rendezvous_backend,
            dynamic_rendezvous,
        )

        from flywheel.agent import rank_order
        from flywheel.agent.agent import FlywheelAgent

    # torch registers these handlers only once the ranks start; a signal during the first rendezvous counts too.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _raise_signal_exception)
    log = logging.getLogger(__name__)
    params = RendezvousParameters(backend=settings.rdzv_backend, endpoint=settings.rdzv_endpoint,
                                  run_id=settings.run_id, min_nodes=settings.min_nodes,
                                  max_nodes=settings.max_nodes, local_addr=settings.local_addr,
                                  **settings.rdzv_configs)
    shutdown_rdzv = True
    rdzv_handler = None
    with tempfile.TemporaryDirectory(prefix="flywheel-launch-", dir=own) as log_dir:
        try:
            # torch's own c10d handler would order the local replicas (all on 127.0.0.1) by pid.
            rdzv_handler = (rank_order.create_ordered_c10d_handler(params) if settings.rdzv_backend == "c10d"
                            else rdzv_registry.get_rendezvous_handler(params))
            entrypoint, args = _rank_entrypoint(command)
            spec = WorkerSpec(role="trainer", local_world_size=settings.nproc_per_node, entrypoint=entrypoint,
                              args=args, rdzv_handler=rdzv_handler, max_restarts=settings.max_restarts,
                              monitor_interval=settings.monitor_interval, local_addr=settings.local_addr)
            agent = FlywheelAgent(spec=spec, logs_specs=DefaultLogsSpecs(log_dir=log_dir), start_method="spawn",
                                  shutdown_timeout=settings.shutdown_timeout)
            result = agent.run()
        except SignalException as err:
            # Leave the rendezvous open: closing it would stop the other workers from re-forming the group.
            shutdown_rdzv = False
            log.warning("stopped by %s; ranks were sent SIGTERM", err.sigval.name)
            rendezvous_expiry.leave_round(rdzv_handler)
            termination_log.write_reason(f"stopped by {err.sigval.name}")
            return exitcodes.STOPPED
        except RendezvousError as err:
            log.error("rendezvous failed: %s: %s", type(err).__name__, err)
            termination_log.write_reason(f"rendezvous failed: {termination_log.exception_reason(err)}")
            return exitcodes.CRASH
        finally:
            if shutdown_rdzv and rdzv_handler is not None:
                rdzv_handler.shutdown()
        return _exit_code(result)


@contextlib.contextmanager
def _loglevel_env(level: str) -> Iterator[None]:
    """LOGLEVEL set to `level` inside, the caller's value (or none) again after."""
    caller_loglevel = os.environ.get("LOGLEVEL")
    os.environ["LOGLEVEL"] = level
    try:
        yield
    finally:
        if caller_loglevel is None:
            del os.environ["LOGLEVEL"]
        else:
            os.environ["LOGLEVEL"] = caller_loglevel


def _exit_code(result: RunResult | None) -> int:
    """This worker's exit code from the agent's result (logging each failed rank)."""
    if result is None:  # torch's graceful rendezvous exit: this node was not needed
        return exitcodes.SUCCESS
    if not result.is_failed():
        return exitcodes.SUCCESS
    for rank, failure in sorted(result.failures.items()):
        logging.getLogger(__name__).error("rank %d failed: exit %d (%s): %s", rank, failure.exitcode,
                                          exitcodes.describe(failure.exitcode), failure.message)
    from flywheel.agent.agent import first_failure_exit_code

    failures = {rank: (f.exitcode, float(f.timestamp)) for rank, f in result.failures.items()}
    code = first_failure_exit_code(failures)
    # The rank's own words win (it wrote its exception first); else the agent's view: the exit code or signal.
    termination_log.write_reason(rank_restarts.restart_reason(failures, code))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry for `flywheel launch [-- command...]` (argv excludes the program and subcommand names)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = settings_from_env(os.environ, args)
    except LaunchConfigError as err:
        print(f"flywheel launch: {err}", file=sys.stderr)
        termination_log.write_reason(termination_log.exception_reason(err))
        return exitcodes.USER_ERROR
    # Read by the ranks (one intra-op thread unless the user says otherwise), and by the BLAS library torch loads:
    # set before that import, it starts no thread pool in the agent, which then forks its warm zygote (warm.py).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with _loglevel_env("INFO"):  # the seam check imports torch's elastic agent, whose loggers read LOGLEVEL once
        import torch

        from flywheel import torch_compat

        missing = torch_compat.agent_seam_problems()
    if missing:
        reason = (f"flywheel launch needs torch {torch_compat.TESTED_TORCH}.x (the version pyproject pins); torch "
                  f"{torch.__version__} lacks: {'; '.join(missing)}")
        print(f"flywheel launch: {reason}", file=sys.stderr)
        termination_log.write_reason(reason)
        return exitcodes.USER_ERROR
    return run_agent(settings)


if __name__ == "__main__":
    sys.exit(main())
