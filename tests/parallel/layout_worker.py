"""One rank of a small training run under a given layout, for parity tests against a 1-process reference.

`python -m tests.parallel.layout_worker` with torchrun-style env (RANK, WORLD_SIZE, MASTER_ADDR/PORT) and
LAYOUT_RUN = JSON {"parallelism": {...}, "steps", "lr", "globalBatch", "microBatch", "gradClip", "out",
"checkpointDir", "saveAt", "restore", "optimizer", "evalSteps"}.
SGD (no momentum) by default: float noise is not amplified;
"optimizer": "adamw" uses the trainer's AdamW (to check that optimizer state moves between layouts). Rank 0 writes `out`
(JSON: per-step loss and MoE load-balancing loss averaged over the global batch, the restored step) and `out`.pt
(the full parameters). "model" is a trainer.model spec (gpt-tiny by default; with "moe" an MoE model; llama-tiny
for the Llama); "metaInit": true builds it on the meta device, "seed" its init seed (0), "initOnly" skips
training, "initChunkElements" sets materialize.CHUNK_ELEMENTS. With "evalSteps", an evaluation (trainer/evaluate.py,
on the synthetic held-out stream) after every step: `eval_losses` in `out`.
"""

from __future__ import annotations

import json
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist

from flywheel.spec.job import CheckpointSpec, ModelSpec, Parallelism, Training
from flywheel.trainer.checkpoint.manager import AppState, Checkpointer
from flywheel.trainer.data import SampleLoader, build_source, build_validation_source
from flywheel.trainer.distributed.parallelize import DP, build_mesh, clip_grad_norm, parallelize
from flywheel.trainer.distributed.pipeline_parallel import full_model_state
from flywheel.trainer.evaluate import EvalContext, evaluate
from flywheel.trainer.ft.process_exit import exit_rank
from flywheel.trainer.models import materialize
from flywheel.trainer.models.materialize import META
from flywheel.trainer.models.registry import build_model
from flywheel.trainer.optim import build_optimizer, build_scheduler
from flywheel.trainer.step import forward_backward


def main() -> None:
    run = json.loads(os.environ["LAYOUT_RUN"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    parallelism = Parallelism.model_validate(run["parallelism"])
    training = Training(steps=run["steps"], global_batch=run["globalBatch"], micro_batch=run["microBatch"],
                        lr=run["lr"], warmup_steps=0, min_lr_ratio=1.0, grad_clip=run.get("gradClip", 0.0),
                        activation_checkpointing=run.get("activationCheckpointing", False),
                        precision=run.get("precision", "fp32"), compile=run.get("compile", False))
    mesh = build_mesh(world, parallelism)
    dp_mesh = mesh[DP]
    cfg = ModelSpec.model_validate(run.get("model", {"preset": "gpt-tiny"})).shape()
    device = META if run.get("metaInit") else None  # meta-device init: materialised by parallelize
    if "initChunkElements" in run:  # small draws, so that tiny models cross row blocks too
        materialize.CHUNK_ELEMENTS = run["initChunkElements"]
    model = parallelize(build_model(cfg, seed=run.get("seed", 0), device=device), mesh, parallelism, training)
    if run.get("optimizer") == "adamw":  # the trainer's own (optimizer state must move between layouts too)
        optimizer = build_optimizer(model, training)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=training.lr, foreach=False)
    scheduler = build_scheduler(optimizer, training)
    loader = SampleLoader(build_source("synthetic", cfg.vocab, cfg.seq_len, 0))
    app = AppState(model, optimizer, scheduler, loader, rank=rank, world_size=world)
    ckpt = Checkpointer(CheckpointSpec(dir=run.get("checkpointDir") or "/unused", every_steps=0, keep=5),
                        run.get("checkpointDir") or "/unused")
    start = (ckpt.restore(app) or 0) if run.get("restore") else 0

    losses, aux_losses, eval_losses = {}, {}, {}
    coordinate = dict(zip(mesh.mesh_dim_names or (), mesh.get_coordinate() or ()))
    eval_ctx = EvalContext(
        model=model, source=build_validation_source(None, loader.source, cfg.vocab, 0), device=torch.device("cpu"),
        autocast=nullcontext(), dp_rank=dp_mesh.get_local_rank(), dp_size=dp_mesh.size(),
        loss_weight=float(all(c == 0 for name, c in coordinate.items() if name != DP)),
        global_batch=training.global_batch, micro_batch=training.micro_batch)
    last_step = 0 if run.get("initOnly") else training.steps  # initOnly: write the initial parameters
    for step in range(start + 1, last_step + 1):
        batches = loader.next_microbatches(dp_mesh.get_local_rank(), dp_mesh.size(), training.global_batch,
                                           training.micro_batch)
        loss, aux = forward_backward(model, batches, torch.device("cpu"), nullcontext())
        if training.grad_clip > 0:
            clip_grad_norm(model, training.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        both = torch.stack([loss, aux])
        dist.all_reduce(both, group=dp_mesh.get_group())  # every tp and pp rank holds the same losses
        losses[step] = both[0].item() / dp_mesh.size()
        aux_losses[step] = both[1].item() / dp_mesh.size()
        if run.get("evalSteps"):
            eval_losses[step] = evaluate(eval_ctx, run["evalSteps"]).loss
        if step == run.get("saveAt"):
            ckpt.save(step, app, blocking=True)
    ckpt.close()
    state = full_model_state(model)  # all stages, on rank 0
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in state.items()}, run["out"] + ".pt")
        with open(run["out"], "w") as f:
            json.dump({"losses": losses, "aux_losses": aux_losses, "eval_losses": eval_losses, "start": start,
                       "consumed": loader.consumed_samples}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_rank(0)
