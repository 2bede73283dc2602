"""A torchrun-style training loop that hangs once, for bench/hang_recovery.py (the same script runs under
torchrun and as a Flywheel job's `spec.command`).

    hang_probe.py LOG MARKER [--steps N] [--stop-step S] [--stop-rank R] [--gloo-timeout SECONDS]

Every rank all_reduces a small tensor per step and appends "step RANK N TIME ATTEMPT" to LOG (ATTEMPT is 1 once
MARKER exists, i.e. after the hang). Rank R SIGSTOPs itself at step S unless MARKER exists (it creates MARKER
first and logs "stop TIME"), so the hang happens once whatever restarts the job. A collective that times out logs
"error RANK TIME" and exits 1. `flywheel.progress` reports each step when Flywheel runs the script (a no-op under
torchrun), so the health monitor can see the hang.
"""

import argparse
import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist

try:
    from flywheel import progress
except ImportError:  # outside Flywheel's image
    progress = None


def log_line(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text + "\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("log")
    p.add_argument("marker")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--steps-after", type=int, default=5, help="steps to run once the hang has happened")
    p.add_argument("--stop-step", type=int, default=20)
    p.add_argument("--stop-rank", type=int, default=1)
    p.add_argument("--gloo-timeout", type=float, default=10.0)
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    attempt = 1 if os.path.exists(args.marker) else 0
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.gloo_timeout))
    x = torch.ones(1024)
    for step in range(1, (args.steps_after if attempt else args.steps) + 1):
        if rank == args.stop_rank and step == args.stop_step and not os.path.exists(args.marker):
            open(args.marker, "w").close()
            log_line(args.log, f"stop {time.time()}")
            os.kill(os.getpid(), signal.SIGSTOP)
        try:
            dist.all_reduce(x)
        except RuntimeError:
            log_line(args.log, f"error {rank} {time.time()}")
            raise SystemExit(1)
        x /= dist.get_world_size()
        time.sleep(0.05)
        log_line(args.log, f"step {rank} {step} {time.time()} {attempt}")
        if progress is not None:
            progress.step(step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
