"""Starts trainer ranks with the worker contract's env (env:// rendezvous on loopback), forked by a warm zygote as
the agent's are (tests/warm_ranks.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

from flywheel.agent.settings import WARM_PRELOAD
from tests.warm_ranks import start_rank

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_spec(world_size: int, *, steps: int = 8, fsdp: bool = False, every_steps: int = 0,
             progress_timeout: float = 60, **training: Any) -> dict[str, Any]:
    """A small TrainingJob spec (camelCase, as in FLYWHEEL_SPEC) for gpt-tiny on `world_size` ranks."""
    train = {"steps": steps, "globalBatch": 8, "microBatch": 2, "lr": 3e-3, "warmupSteps": 2, **training}
    return {"replicas": {"min": world_size, "max": world_size},
            "trainer": {"model": {"preset": "gpt-tiny"}, "training": train, "parallelism": {"fsdp": fsdp}},
            "checkpoint": {"dir": "/unused", "everySteps": every_steps},
            "faultTolerance": {"progressTimeoutSeconds": progress_timeout, "firstStepTimeoutSeconds": 120}}


def launch(world_size: int, spec: dict[str, Any], workdir: Path, *, faults: list[dict[str, Any]] | None = None,
           restart_count: int = 0, extra_env: dict[str, str] | None = None) -> list[subprocess.Popen[bytes]]:
    port = free_port()
    procs = []
    for rank in range(world_size):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), TORCHELASTIC_RESTART_COUNT=str(restart_count),
                   FLYWHEEL_JOB="tests/tiny", FLYWHEEL_REPLICA_INDEX="0", FLYWHEEL_SPEC=json.dumps(spec),
                   FLYWHEEL_CHECKPOINT_DIR=str(workdir / "ckpt"), FLYWHEEL_METRICS_PORT="0",
                   FLYWHEEL_EVENTS_FILE=str(workdir / "events.jsonl"), FLYWHEEL_FAULT_DIR=str(workdir / "faults"),
                   FLYWHEEL_FAULTS=json.dumps(faults or []))
        env.update(extra_env or {})
        log = open(workdir / f"rank{rank}.log", "ab")
        procs.append(start_rank("flywheel.trainer", env, log, preload=WARM_PRELOAD))
        log.close()
    return procs


def run(world_size: int, spec: dict[str, Any], workdir: Path, *, timeout: float = 90, **kwargs: Any) -> list[int]:
    """Runs all ranks to completion; returns their exit codes (killing all of them on timeout)."""
    workdir.mkdir(parents=True, exist_ok=True)
    procs = launch(world_size, spec, workdir, **kwargs)
    try:
        return [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def wait_while_peer_stopped(procs: list[subprocess.Popen], timeout: float) -> tuple[int, bool]:
    """Rank 0's exit code while rank 1 is SIGSTOPped (by a hang fault), and whether rank 1 was still stopped then
    (it cannot exit by itself); every rank still there is killed afterwards."""
    try:
        code = procs[0].wait(timeout=timeout)
        stopped = procs[1].poll() is None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return code, stopped


def events(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def losses(workdir: Path) -> dict[int, float]:
    """The last loss logged for each step (a replayed step overwrites the lost attempt)."""
    return {e["step"]: e["loss"] for e in events(workdir) if e["event"] == "step"}


def logs(workdir: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(workdir.glob("rank*.log")))
