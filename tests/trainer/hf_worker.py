"""One rank of the Hugging Face round trip: import a HF directory under a layout, record its logits, train a few
AdamW steps, record the loss on a fixed batch, save a checkpoint.

`python -m tests.trainer.hf_worker` with torchrun-style env and HF_RUN = JSON {"pretrained", "parallelism", "steps",
"checkpointDir", "out", "stateOnly"}. Rank 0 writes `out` (torch.save: {"logits", "tokens", "loss"}; with
stateOnly only the loaded parameters, gathered)."""

from __future__ import annotations

import json
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule

from flywheel.spec.job import CheckpointSpec, ModelSpec, Parallelism, Training
from flywheel.trainer.checkpoint.manager import AppState, Checkpointer
from flywheel.trainer.data import SampleLoader, build_source
from flywheel.trainer.distributed.parallelize import DP, build_mesh, parallelize
from flywheel.trainer.distributed.pipeline_parallel import full_model_state
from flywheel.trainer.ft.process_exit import exit_rank
from flywheel.trainer.models.hf_export import write_model_record
from flywheel.trainer.models.hf_weights import load_pretrained
from flywheel.trainer.models.registry import build_model, model_shape
from flywheel.trainer.optim import build_optimizer, build_scheduler
from flywheel.trainer.step import forward_backward

SEQ = 16


def forward_only(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Logits without backward; FSDP2 keeps the last block's parameters unsharded after forward (for backward),
    so they are resharded here, or the optimizer's (sharded) parameters would not be the model's."""
    with torch.no_grad():
        logits = model(tokens)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    return logits.full_tensor() if hasattr(logits, "full_tensor") else logits


def main() -> None:
    run = json.loads(os.environ["HF_RUN"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    parallelism = Parallelism.model_validate(run["parallelism"])
    training = Training(steps=run["steps"], global_batch=4, micro_batch=2, lr=1e-2, warmup_steps=0, min_lr_ratio=1.0,
                        grad_clip=0.0)
    shape = model_shape(ModelSpec(pretrained=run["pretrained"], seqLen=SEQ))
    mesh = build_mesh(dist.get_world_size(), parallelism)
    model = parallelize(build_model(shape, seed=1), mesh, parallelism, training)
    load_pretrained(model, run["pretrained"], shape)
    if run.get("stateOnly"):  # pipeline stages: no plain forward; the loaded parameters, gathered on rank 0
        state = full_model_state(model)
        if dist.get_rank() == 0:
            torch.save({k: v.detach().clone() for k, v in state.items()}, run["out"])
        dist.barrier()
        dist.destroy_process_group()
        return
    tokens = torch.randint(0, shape.vocab, (2, SEQ), generator=torch.Generator().manual_seed(0))
    logits = forward_only(model, tokens)

    optimizer = build_optimizer(model, training)  # AdamW: optimizer state exists when the checkpoint is taken
    loader = SampleLoader(build_source("synthetic", shape.vocab, SEQ, 0))
    dp = mesh[DP]
    for _ in range(training.steps):
        batches = loader.next_microbatches(dp.get_local_rank(), dp.size(), training.global_batch, training.micro_batch)
        forward_backward(model, batches, torch.device("cpu"), nullcontext())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    trained = forward_only(model, tokens)
    loss = F.cross_entropy(trained[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())

    app = AppState(model, optimizer, build_scheduler(optimizer, training), loader, rank=dist.get_rank(),
                   world_size=dist.get_world_size())
    ckpt = Checkpointer(CheckpointSpec(dir=run["checkpointDir"], every_steps=0), run["checkpointDir"])
    if dist.get_rank() == 0:
        write_model_record(run["checkpointDir"], shape, run["pretrained"])
    ckpt.save(training.steps, app, blocking=True)
    ckpt.close()
    if dist.get_rank() == 0:
        torch.save({"logits": logits, "tokens": tokens, "loss": loss}, run["out"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_rank(0)
