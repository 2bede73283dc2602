"""The worker process's entry (`python -m flywheel.trainer` under the elastic agent, docs/contracts.md): logging and
threads, the worker env, deterministic kernels, the process group, then the training loop (train_loop.py); every
way out is an exit code (contracts/exitcodes.py) with its reason where the executors read it (the event log, the
termination log).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping

import torch
import torch.distributed as dist

from flywheel.agent.store_ready import wait_for_store
from flywheel.agent.worker_env import StopRequest, UserError, WorkerEnv
from flywheel.contracts import exitcodes, termination_log
from flywheel.eventlog import EventLog, EventName, one_line
from flywheel.layout.hf_config import HFConfigError
from flywheel.spec import SpecError
from flywheel.spec.job import Training
from flywheel.spec.timeouts import collective_timeouts
from flywheel.trainer.data import DataError
from flywheel.trainer.distributed.collective_env import apply_collective_env, collective_env
from flywheel.trainer.distributed.parallelize import ParallelismError
from flywheel.trainer.metrics import TrainerMetrics
from flywheel.trainer.progress_publisher import progress_events
from flywheel.trainer.startup import CLOCK
from flywheel.trainer.train_loop import preflight, train, watchdog_for

log = logging.getLogger("flywheel.trainer")

USER_ERRORS = (UserError, SpecError, DataError, ParallelismError, HFConfigError)


def main(environ: Mapping[str, str] | None = None) -> int:
    """The worker entry point; returns the process exit code (contracts/exitcodes.py)."""
    CLOCK.mark("imports")  # the interpreter and the imports, from the process's start (a warm fork's: ~0)
    environ = os.environ if environ is None else environ
    rank = environ.get("RANK", "?")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s")
    # One intra-op thread per rank unless told otherwise: ranks share the cores, and more threads per rank made
    # CPU training several times slower (2 threads per rank at world 4: 4.7x slower, docs/architecture.md).
    threads = environ.get("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else 1)
    try:
        env = WorkerEnv.from_environ(environ)
    except UserError as err:
        return user_error(EventLog(environ.get("FLYWHEEL_EVENTS_FILE") or None), rank, err)
    if env.spec.command:
        return user_error(EventLog(env.events_file), env.rank,
                          UserError("spec.command is set: the job runs a user command, not the embedded trainer"))
    use_deterministic_algorithms(env.spec.trainer.training)

    events = progress_events(env.events_file, env.rank)  # rank 0 also publishes progress to etcd
    metrics = _metrics(env)
    stop = StopRequest()
    stop.install()
    # Started before the rendezvous: the first-step allowance covers start-up and restore too.
    watchdog = watchdog_for(env, events, metrics).start()
    try:
        sources = preflight(env)
        CLOCK.mark("preflight")  # env, event log, metrics server, watchdog, the data opened
        began = time.monotonic()
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        # The collective-watchdog env (NCCL async error handling, flight recorder, dump pipe) is set in one place.
        timeouts = collective_timeouts(env.spec.fault_tolerance)
        apply_collective_env(collective_env(env.local_checkpoint_dir, timeouts))
        wait_for_store(environ, timeouts.startup.total_seconds())  # one connect, not torch's refused-connect backoff
        dist.init_process_group(backend, timeout=timeouts.startup)
        metrics.rendezvous_seconds.set(time.monotonic() - began)
        CLOCK.mark("rendezvous")
        code = train(env, sources, events, metrics, watchdog, stop, timeouts)
        watchdog.stop()  # shutting down below may take a while; the code is decided
        dist.destroy_process_group()
        return code
    except USER_ERRORS as err:
        return user_error(events, env.rank, err)
    except Exception as err:  # noqa: BLE001  (_failed logs it and says why in the termination log)
        return _failed(err, env, events, metrics)
    finally:
        # On every way out: a watchdog still running once main() has returned (after a user error in preflight,
        # say) ends the process that called it when the first-step allowance runs out (a test run, in process).
        watchdog.stop()


def _metrics(env: WorkerEnv) -> TrainerMetrics:
    labels = {"job": env.job, "namespace": env.namespace, "replica": env.replica, "rank": str(env.rank)}
    try:
        return TrainerMetrics(env.metrics_port if env.local_rank == 0 else 0, labels)
    except OSError as err:  # e.g. the port is still held by the previous incarnation: train without serving
        log.warning("cannot serve metrics on port %d (%s); continuing without", env.metrics_port, err)
        return TrainerMetrics(0, labels)


def _failed(err: Exception, env: WorkerEnv, events: EventLog, metrics: TrainerMetrics) -> int:
    """The exit code for an error the loop did not expect, with its reason where the executor reads it."""
    if _NO_DETERMINISTIC_KERNEL in str(err):
        return user_error(events, env.rank, UserError(
            f"training.deterministic: {one_line(str(err))}; set trainer.training.deterministic: false (a "
            "resume is then not bitwise exact) or use a layout or precision whose kernels have one"))
    log.exception("training failed")
    termination_log.write_reason(termination_log.exception_reason(err))
    if _is_collective_failure(err):
        metrics.collective_failures_total.inc()
        # The counter dies with the process; the event log keeps the fact for the executor and the timeline.
        events.emit(EventName.COLLECTIVE_TIMEOUT, rank=env.rank, error=str(err)[:500])
        return exitcodes.COLLECTIVE_TIMEOUT
    return exitcodes.CRASH


def user_error(events: EventLog, rank: int | str, err: Exception) -> int:
    """A permanent error: logged, and its reason (the exception's last line) put in the event log, so the summary
    and the job's status say why without the worker log."""
    log.error("%s", err)
    events.emit(EventName.USER_ERROR, rank=int(rank) if str(rank).isdigit() else None,
                reason=one_line(f"{type(err).__name__}: {err}"))
    termination_log.write_reason(termination_log.exception_reason(err))
    return exitcodes.USER_ERROR


def use_deterministic_algorithms(training: Training) -> None:
    """training.deterministic: deterministic kernels only. Not warn_only, on CUDA too: with warn_only torch keeps
    the non-deterministic algorithm of kernels that have a deterministic one (memory-efficient attention's backward:
    two identical passes on an H200 gave different gradients, so a resume was not bitwise exact); a kernel with none
    fails the run with its name (main turns that into a USER_ERROR naming the field).

    Without torch's fill of uninitialized memory, which deterministic mode turns on: a debugging aid that writes NaN
    into every `torch.empty` (FSDP2's all-gather and reduce-scatter buffers each step: ~4% of a CPU step at two
    processes), changing no result of kernels that write their outputs before reading them."""
    if training.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it for deterministic matmuls
        torch.use_deterministic_algorithms(True)
        torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]


# What torch says when a deterministic run reaches a kernel that has no deterministic implementation.
_NO_DETERMINISTIC_KERNEL = "does not have a deterministic implementation"


def _is_collective_failure(err: BaseException) -> bool:
    if isinstance(err, dist.DistError):
        return True
    text = str(err)
    # "pair closure": a gloo collective queued behind one that timed out on the same connection (the step's
    # loss/stop-flag reduction is queued ahead of DDP's gradient buckets) fails with the connection it shared.
    return isinstance(err, RuntimeError) and any(s in text for s in (
        "gloo", "Gloo", "NCCL", "Timed out", "timed out", "Connection closed by peer", "pair closure"))
