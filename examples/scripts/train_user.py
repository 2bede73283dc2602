"""A small torchrun-style user script: no Flywheel imports, just the env torchrun/`flywheel launch` provides.

Each rank joins a gloo group, runs a few all_reduce "steps" and checks the result, then exits 0.
"""

import os
import time

import torch
import torch.distributed as dist

STEPS = int(os.environ.get("TRAIN_USER_STEPS", "5"))
STEP_SECONDS = float(os.environ.get("TRAIN_USER_STEP_SECONDS", "0"))  # a slower loop, for tests that stop a rank


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    value = torch.zeros(4)
    for step in range(1, STEPS + 1):
        contribution = torch.full((4,), float(rank + step))
        dist.all_reduce(contribution)
        # sum over ranks of (rank + step) = world*step + world*(world-1)/2
        expected = world * step + world * (world - 1) / 2
        assert torch.allclose(contribution, torch.full((4,), expected)), (contribution, expected)
        value += contribution
        time.sleep(STEP_SECONDS)
    if rank == 0:
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        print(f"train_user: world={world} steps={STEPS} restart={restart} checksum={value.sum().item():.1f}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
