"""The collective watchdog settings: environment (pure), logging of every variable, and on real gloo processes the
long start-up timeout followed by the short steady one."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

from flywheel.spec.job import FaultTolerance
from flywheel.spec.timeouts import CollectiveTimeouts, collective_timeouts
from flywheel.trainer.distributed.collective_env import apply_collective_env, collective_env, debug_dir


def test_timeouts_follow_the_spec() -> None:
    t = collective_timeouts(FaultTolerance(progress_timeout_seconds=60, first_step_timeout_seconds=600))
    assert (t.startup, t.steady) == (timedelta(seconds=600), timedelta(seconds=48))
    tiny = collective_timeouts(FaultTolerance(progress_timeout_seconds=2, first_step_timeout_seconds=1))
    assert (tiny.startup, tiny.steady) == (timedelta(seconds=5), timedelta(seconds=5))  # floor; startup >= steady
    off = collective_timeouts(FaultTolerance(progress_timeout_seconds=0))
    assert off.steady == timedelta(seconds=600)


def test_environment_points_dumps_into_the_checkpoint_volume(tmp_path: Path) -> None:
    env = collective_env(tmp_path, CollectiveTimeouts(timedelta(seconds=600), timedelta(seconds=48)))
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and int(env["TORCH_FR_BUFFER_SIZE"]) > 0
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "96"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(debug_dir(tmp_path) / "nccl_trace_rank_")
    # Writing a byte to <prefix><rank>.pipe (torch appends "<rank>.pipe") makes that rank dump its flight recorder.
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == str(debug_dir(tmp_path) / "nccl_pipe_rank_")


def test_apply_logs_every_variable_and_keeps_explicit_ones(tmp_path: Path, caplog) -> None:
    desired = collective_env(tmp_path / "ckpt", CollectiveTimeouts(timedelta(seconds=60), timedelta(seconds=10)))
    environ = {"TORCH_FR_BUFFER_SIZE": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "PATH": "/bin"}
    with caplog.at_level(logging.INFO, logger="flywheel.trainer.distributed.collective_env"):
        effective = apply_collective_env(desired, environ)
    assert effective["TORCH_FR_BUFFER_SIZE"] == "0" == environ["TORCH_FR_BUFFER_SIZE"]
    assert environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2" and environ["PATH"] == "/bin"
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == len(desired)
    for key in desired:
        assert sum(key in m for m in messages) == 1, key
    kept = [r for r in caplog.records if "FR_BUFFER_SIZE" in r.getMessage()][0]
    assert kept.levelno == logging.WARNING and "kept" in kept.getMessage()
    assert debug_dir(tmp_path / "ckpt").is_dir()


WORKER = """
    import os, sys, time
    from datetime import timedelta
    import torch, torch.distributed as dist
    from flywheel.spec.timeouts import CollectiveTimeouts
    from flywheel.trainer.distributed.collective_env import shorten_timeouts
    rank = int(os.environ["RANK"])
    timeouts = CollectiveTimeouts(timedelta(seconds=30), timedelta(seconds=1.5))
    dist.init_process_group("gloo", timeout=timeouts.startup)
    if rank == 1:
        time.sleep(2.5)  # a slow first step: longer than the steady timeout, fine under the start-up one
    dist.all_reduce(torch.ones(1))
    shorten_timeouts(timeouts)
    if rank == 1:
        time.sleep(60)  # a stuck peer
    began = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1))
    except Exception as err:
        print(f"timed out after {time.monotonic() - began:.2f}s: {type(err).__name__}", flush=True)
        os._exit(5)
    os._exit(0)
"""


def test_gloo_long_startup_then_short_steady_timeout(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
        procs.append(subprocess.Popen([sys.executable, "-c", textwrap.dedent(WORKER)], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      cwd=Path(__file__).resolve().parents[2]))
    try:
        out, err = procs[0].communicate(timeout=60)
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    assert procs[0].returncode == 5, out + err
    seconds = float(out.split("timed out after ")[1].split("s")[0])
    assert 1.0 <= seconds < 6.0, out
