"""One optimizer step's pieces, shared by the training loop, the benchmarks' plain loop and the layout tests: the
device, the precision context, the forward/backward over a rank's micro batches, and the parameter digest that
proves two runs bitwise equal."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn

from flywheel.trainer.data import MicroBatch
from flywheel.trainer.distributed.parallelize import gradient_sync
from flywheel.trainer.distributed.pipeline_parallel import PipelinedModel, full_model_state
from flywheel.trainer.models.moe import aux_loss_of

log = logging.getLogger("flywheel.trainer")


def pick_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def autocast_for(device: torch.device, precision: str) -> AbstractContextManager[object]:
    if precision != "bf16":
        return nullcontext()
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        log.warning("bf16 requested but %s does not support it; training in fp32", device)
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def params_sha256(model: nn.Module) -> str | None:
    """sha256 over the full (unsharded) state dict: keys sorted, each tensor's fp32 contiguous bytes. A collective;
    the digest is returned on rank 0 only (the others get None)."""
    state = full_model_state(model)
    if state is None:
        return None
    digest = hashlib.sha256()
    for key in sorted(state):
        digest.update(state[key].detach().float().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


LossesReady = Callable[[torch.Tensor, torch.Tensor], None]


def forward_backward(model: nn.Module, batches: list[MicroBatch], device: torch.device,
                     autocast: AbstractContextManager[object],
                     losses_ready: LossesReady | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Accumulates gradients over this rank's micro batches (reducing them across dp only with the last one);
    returns this rank's mean language-model loss and mean MoE load-balancing loss (weighted; zero for a dense
    model), detached. The gradient is that of their sum. A pipelined model runs them through its schedule instead
    (the loss then comes from the last stage, on every pp rank).

    `losses_ready(loss, aux)` gets those two as soon as they are known: after the last forward, before its backward,
    so a collective over them (the loop's loss and stop-flag reduction) overlaps the backward (after the schedule
    for a pipelined model)."""
    aux_sum = torch.zeros((), device=device)
    if isinstance(model, PipelinedModel):
        loss = model.train_step(batches, device, autocast)
        if losses_ready is not None:
            losses_ready(loss, aux_sum)
        return loss, aux_sum
    loss_sum = torch.zeros((), device=device)
    for i, (inputs, targets) in enumerate(batches):
        last = i == len(batches) - 1
        inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        with gradient_sync(model, enabled=last):
            with autocast:
                # The model's head and loss together (models/lm_loss.py): the logits, never returned, go before
                # backward, and a chunked loss never holds them for the whole micro batch.
                loss = model(inputs, targets)
            aux = aux_loss_of(model)
            loss_sum += loss.detach()
            if aux is not None:
                aux_sum += aux.detach()
            if last and losses_ready is not None:
                losses_ready(loss_sum / len(batches), aux_sum / len(batches))
            # Micro batches are equally sized: dividing by their number averages over this rank's share of the
            # global batch, and the gradient reduction (an average) then over all of it.
            torch.autograd.backward((loss if aux is None else loss + aux) / len(batches))
    return loss_sum / len(batches), aux_sum / len(batches)
