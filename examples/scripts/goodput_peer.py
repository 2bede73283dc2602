"""The peer of bench/goodput.py: a textbook torchrun training script on Flywheel's model, data and optimizer.

What a competent user writes without Flywheel: DDP, a synchronous `torch.distributed.checkpoint.save` every
$GOODPUT_CKPT_EVERY steps into <dir>/step-N (rank 0 then points <dir>/latest at it, atomically, and keeps the newest
3), and on every (re)start a resume from the latest one (model, optimizer, lr schedule, data position). The process
group gets a collective timeout ($GOODPUT_PG_TIMEOUT seconds) so a hung peer surfaces as an error that torchrun can
restart on. Rank 0 appends JSON lines to $GOODPUT_EVENTS in the trainer's event schema (`start`, `step`,
`checkpoint`, `done`) so the bench reads both sides with one parser.

Env: FLYWHEEL_SPEC (the TrainingJob spec as JSON; model, training and data sections are used), GOODPUT_CKPT_DIR,
GOODPUT_CKPT_EVERY, GOODPUT_EVENTS, GOODPUT_PG_TIMEOUT, plus torchrun's RANK/WORLD_SIZE/... .
"""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

from flywheel.spec import parse_spec
from flywheel.trainer.data import SampleLoader, build_source
from flywheel.trainer.models.gpt.model import GPT
from flywheel.trainer.optim import build_optimizer, build_scheduler

KEEP = 3


def emit(path: str, event: str, **fields: object) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")


def latest(ckpt: Path) -> int:
    try:
        return int((ckpt / "latest").read_text())
    except (FileNotFoundError, ValueError):
        return 0


def main() -> None:
    torch.set_num_threads(1)
    spec = parse_spec(json.loads(os.environ["FLYWHEEL_SPEC"]))
    training = spec.trainer.training
    torch.use_deterministic_algorithms(training.deterministic)
    ckpt = Path(os.environ["GOODPUT_CKPT_DIR"])
    every = int(os.environ.get("GOODPUT_CKPT_EVERY", "50"))
    events = os.environ["GOODPUT_EVENTS"]
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ.get("GOODPUT_PG_TIMEOUT", "30"))))
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = spec.trainer.model.shape()
    model = DistributedDataParallel(GPT(cfg, seed=training.seed))
    optimizer = build_optimizer(model, training)
    scheduler = build_scheduler(optimizer, training)
    loader = SampleLoader(build_source(spec.trainer.data.source, cfg.vocab, cfg.seq_len, training.seed))

    start = latest(ckpt)
    if start:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd, "step": torch.tensor(0)}
        dcp.load(state, checkpoint_id=str(ckpt / f"step-{start:08d}"))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        loader.consumed_samples = start * training.global_batch
        for _ in range(start):
            scheduler.step()
    if rank == 0:
        emit(events, "start", rank=0, world_size=world,
             restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), resumed_from=start or None)

    for step in range(start + 1, training.steps + 1):
        began = time.perf_counter()
        batches = loader.next_microbatches(rank, world, training.global_batch, training.micro_batch)
        for i, (inputs, targets) in enumerate(batches):
            with model.no_sync() if i < len(batches) - 1 else torch.enable_grad():
                loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
                (loss / len(batches)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), training.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = loss.item()
        if rank == 0:
            emit(events, "step", step=step, loss=loss_value, step_seconds=time.perf_counter() - began,
                 world_size=world)
        if step % every == 0 or step == training.steps:
            saved = time.perf_counter()
            model_sd, optim_sd = get_state_dict(model, optimizer)
            dcp.save({"model": model_sd, "optim": optim_sd, "step": torch.tensor(step)},
                     checkpoint_id=str(ckpt / f"step-{step:08d}"))
            dist.barrier()  # every rank's shard is written before `latest` moves
            if rank == 0:
                tmp = ckpt / "latest.tmp"
                tmp.write_text(str(step))
                os.replace(tmp, ckpt / "latest")
                old = sorted(p for p in ckpt.glob("step-*") if p.is_dir())[:-KEEP]
                for path in old:
                    shutil.rmtree(path, ignore_errors=True)
                emit(events, "checkpoint", step=step, blocking_seconds=time.perf_counter() - saved)
    if rank == 0:
        emit(events, "done", step=training.steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
