"""Minimal torchrun-style training loop for the restart-latency benchmark (bench/restart_latency.py).

Every rank all_reduces a small tensor per step. Rank $PROBE_KILL_RANK SIGKILLs itself at step $PROBE_KILL_STEP
on the first attempt only. Rank 0 appends "step N TIME RESTART_COUNT" lines to $PROBE_LOG, the killer a
"kill TIME" line just before dying.
"""

import os
import signal
import time

import torch
import torch.distributed as dist


def main() -> None:
    rank = int(os.environ["RANK"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    steps, kill_step = int(os.environ.get("PROBE_STEPS", "10")), int(os.environ.get("PROBE_KILL_STEP", "5"))
    kill_rank = int(os.environ.get("PROBE_KILL_RANK", "1"))
    log = os.environ["PROBE_LOG"]
    dist.init_process_group("gloo")
    x = torch.ones(1024)
    for step in range(1, steps + 1):
        if rank == kill_rank and step == kill_step and restart == 0:
            with open(log, "a") as f:
                f.write(f"kill {time.time()}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(x)
        x /= dist.get_world_size()
        time.sleep(0.05)
        if rank == 0:
            with open(log, "a") as f:
                f.write(f"step {step} {time.time()} {restart}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
