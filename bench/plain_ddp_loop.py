"""The peer of bench/trainer_overhead.py: the textbook DDP loop on the trainer's model, data and optimizer, with
nothing else (no metrics, watchdog, events, checkpoints, fault hooks). Run once per rank with torchrun-style env."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from flywheel.spec import parse_spec
from flywheel.trainer.data import SampleLoader, build_source
from flywheel.trainer.entry import use_deterministic_algorithms
from flywheel.trainer.ft.process_exit import exit_rank
from flywheel.trainer.models.registry import build_model
from flywheel.trainer.optim import build_optimizer, build_scheduler


def main() -> None:
    torch.set_num_threads(1)
    spec = parse_spec(json.loads(os.environ["FLYWHEEL_SPEC"]))
    training = spec.trainer.training
    # Same numerics setting as the trainer (its fill of uninitialized memory off too), so the ratio measures the
    # loop's extras and nothing else.
    use_deterministic_algorithms(training)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = spec.trainer.model.shape()
    model = DistributedDataParallel(build_model(cfg, seed=training.seed))  # GPT or Llama, as the spec says
    optimizer = build_optimizer(model, training)
    scheduler = build_scheduler(optimizer, training)
    loader = SampleLoader(build_source("synthetic", cfg.vocab, cfg.seq_len, training.seed))
    times = []
    for _ in range(training.steps):
        began = time.perf_counter()
        batches = loader.next_microbatches(rank, world, training.global_batch, training.micro_batch)
        for i, (inputs, targets) in enumerate(batches):
            sync = i == len(batches) - 1
            with model.no_sync() if not sync else torch.enable_grad():
                loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
                (loss / len(batches)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), training.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - began)
    if rank == 0:
        Path(os.environ["FLYWHEEL_CHECKPOINT_DIR"]).parent.joinpath("plain_steps.json").write_text(json.dumps(times))
    # Every rank reaches the end before any leaves: rank 0 hosts the store, and a rank still tearing down its group
    # after rank 0 exited waited out the store's 30-minute timeout (seen with the fast llama-tiny steps).
    dist.barrier()
    dist.destroy_process_group()
    exit_rank(0)  # the result is written; interpreter shutdown could deadlock or abort (process_exit's doc)


if __name__ == "__main__":
    main()
