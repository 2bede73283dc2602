"""`flywheel run JOB.yaml`: validate, plan, host the rendezvous store, supervise, report.

Exit codes: 0 the job succeeded, 1 it failed (or another run holds its output or checkpoint directory,
run_lock.py), 2 the spec (or a --fault flag) is bad, 130 interrupted.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from flywheel.agent.rendezvous.expiry import expire_local_agent
from flywheel.local.fault_flags import (
    FaultFlagError,
    LoseWorker,
    RankFault,
    check_targets,
    command_rank_faults,
    parse_faults,
    worker_faults,
)
from flywheel.local.progress_bar import make_progress
from flywheel.local.report import print_summary, write_report
from flywheel.local.run_lock import DirectoryInUse, run_lock
from flywheel.local.run_record import RunRecord
from flywheel.local.store_host import HOST, StoreHost
from flywheel.local.supervisor import Outcome, Supervisor
from flywheel.spec import SpecError, TrainingJob, load_job
from flywheel.spec import storage as object_store
from flywheel.spec.parse import check_local_paths
from flywheel.worker_plan import Placement, faults_env, plan_workers

EXIT_SUCCEEDED, EXIT_FAILED, EXIT_BAD_SPEC, EXIT_INTERRUPTED = 0, 1, 2, 130
_EXIT = {Outcome.SUCCEEDED: EXIT_SUCCEEDED, Outcome.FAILED: EXIT_FAILED, Outcome.INTERRUPTED: EXIT_INTERRUPTED}


@dataclass(frozen=True)
class RunOptions:
    job_file: str
    out: str | None = None  # default runs/<name>/
    faults: tuple[str, ...] = ()
    checkpoint_dir: str | None = None  # overrides spec.checkpoint.dir
    progress: bool = True
    metrics_port_base: int = 0
    spares: int | None = None  # warm spare workers; None: spec.replicas.spares
    launcher: tuple[str, ...] = field(default_factory=lambda: (sys.executable, "-m", "flywheel.cli", "launch"))


def _host_store() -> Any:
    """The c10d rendezvous store, hosted here so it outlives any worker (store_host.py)."""
    return StoreHost().store()


def _fresh_out_dir(out: Path) -> None:
    """Events, logs and fault markers belong to one run; checkpoints (elsewhere or under ckpt/) are kept."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("events.jsonl", "summary.json", "loss.png", "timeline.png"):
        (out / name).unlink(missing_ok=True)
    for name in ("logs", "faults", "spares"):
        shutil.rmtree(out / name, ignore_errors=True)
    (out / "logs").mkdir()
    (out / "faults").mkdir()
    (out / "spares").mkdir()


def load_checked(options: RunOptions) -> tuple[TrainingJob, list[dict[str, object]]]:
    job = load_job(options.job_file)
    check_local_paths(job, options.checkpoint_dir)
    faults = parse_faults(options.faults)
    spec = job.spec
    check_targets(faults, spec.replicas.desired, spec.replicas.desired * spec.procs_per_replica)
    return job, faults


def spare_count(options: RunOptions, job: TrainingJob) -> int:
    """`--spares` when given, else `spec.replicas.spares` (0 when the spec has no such field)."""
    if options.spares is not None:
        return options.spares
    return int(getattr(job.spec.replicas, "spares", 0) or 0)


def run_job(options: RunOptions, console: Console | None = None) -> int:
    console = console or Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 120))  # log files: do not wrap lines at 80 columns
    try:
        job, faults = load_checked(options)
    except (SpecError, FaultFlagError) as err:
        console.print(f"[red]{options.job_file}: {err}[/]", highlight=False)
        return EXIT_BAD_SPEC
    out = Path(options.out or Path("runs") / job.name).resolve()
    ckpt_dir = options.checkpoint_dir or job.spec.checkpoint.dir
    if not object_store.is_url(ckpt_dir):
        ckpt_dir = str(Path(ckpt_dir).resolve())
    staged = object_store.local_dir(ckpt_dir, job.spec.checkpoint.local_dir)
    try:
        with run_lock({"output directory (--out)": out,
                       "checkpoint.localDir" if object_store.is_url(ckpt_dir) else "checkpoint.dir": Path(staged)},
                      options.job_file):
            return _run_locked(options, job, faults, out, ckpt_dir, console)
    except DirectoryInUse as err:
        console.print(f"[red]{job.name}: {err}[/]", highlight=False)
        return EXIT_FAILED


def _run_locked(options: RunOptions, job: TrainingJob, faults: list[dict[str, object]], out: Path, ckpt_dir: str,
                console: Console) -> int:
    spec = job.spec
    _fresh_out_dir(out)
    events_file = out / "events.jsonl"
    store = StoreHost()  # served from a thread while the workers start
    host, port = HOST, store.port
    placement = Placement(replicas=spec.replicas.desired, rdzv_backend="c10d", rdzv_endpoint=f"{host}:{port}",
                          master_addr=host, master_port=port, checkpoint_dir=ckpt_dir,
                          launcher=options.launcher, metrics_port_base=options.metrics_port_base,
                          events_file=str(events_file), extra_env=faults_env(faults, str(out / "faults")))
    plans = plan_workers(job, placement)
    world_size = placement.replicas * spec.procs_per_replica
    spares = spare_count(options, job)
    with_spares = f" + {spares} warm spare{'s' if spares != 1 else ''}" if spares else ""
    console.print(f"[bold]{job.name}[/]: {placement.replicas} workers x {spec.procs_per_replica} ranks "
                  f"(world {world_size}){with_spares}, checkpoints in {ckpt_dir}, logs in {out / 'logs'}",
                  highlight=False)
    record = RunRecord()
    start = time.time()
    total_steps = 0 if spec.command else spec.trainer.training.steps  # a user script reports no steps
    with make_progress(console, job.name, total_steps, options.progress) as progress:
        supervisor_faults: list[LoseWorker | RankFault] = [*worker_faults(faults),
                                                           *(command_rank_faults(faults) if spec.command else [])]
        supervisor = Supervisor(spec, plans, events_file, out / "logs", record, progress, supervisor_faults,
                                spares=spares,
                                expire_agent=lambda run_id, pid: expire_local_agent(store.store(), run_id, pid))
        outcome = supervisor.run()
    wall = time.time() - start
    store.close()
    exit_code = _EXIT[outcome]
    summary = record.summary(job=job.name, status=outcome.value, exit_code=exit_code, world_size=world_size,
                             start_time=start, wall_seconds=wall)
    summary["message"] = supervisor.message
    write_report(out, record, summary, start)
    print_summary(console, summary, out)
    return exit_code
