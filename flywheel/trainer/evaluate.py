"""Evaluation: the mean language-model loss over the first `evalSteps x globalBatch` validation samples.

Every rank of the layout takes part (the same parallel layout as training: tp and pp ranks of one dp index read
the same batch, each dp rank its contiguous slice), with no gradient and the modules in eval mode; the per-rank
means are averaged across the data-parallel group by one all-reduce. The samples are always the same ones, read by
a loader of their own, so an evaluation changes neither the training data position nor any RNG: exact resume stays
bitwise, and the eval loss after a resume equals the one the first attempt logged.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from flywheel.trainer.data import MicroBatch, SampleLoader, SampleSource
from flywheel.trainer.distributed.pipeline_parallel import PipelinedModel


@dataclass(frozen=True)
class EvalPlan:
    """When and how much to evaluate (training.evalEverySteps / evalSteps)."""

    every_steps: int  # 0: never
    batches: int  # global batches per evaluation
    last_step: int  # training.steps: the last step is always evaluated (when evaluation is on)

    def due(self, step: int) -> bool:
        return self.every_steps > 0 and (step % self.every_steps == 0 or step == self.last_step)


@dataclass(frozen=True)
class EvalResult:
    loss: float  # mean over the evaluated samples
    seconds: float

    @property
    def perplexity(self) -> float:
        return perplexity(self.loss)


def perplexity(loss: float) -> float:
    """exp(loss); inf where that overflows (a diverged model), never an exception."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def _rank_loss(model: nn.Module, batches: list[MicroBatch], device: torch.device,
               autocast: AbstractContextManager[object]) -> torch.Tensor:
    """This rank's mean loss over its micro batches (the same accumulation as training's, without backward)."""
    if isinstance(model, PipelinedModel):
        return model.run_schedule(batches, device, autocast, train=False)
    loss_sum = torch.zeros((), device=device)
    for inputs, targets in batches:
        inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        with autocast:
            logits = model(inputs)
        loss_sum += F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    return loss_sum / len(batches)


@dataclass(frozen=True)
class EvalContext:
    """What an evaluation needs from the training set-up."""

    model: nn.Module
    source: SampleSource
    device: torch.device
    autocast: AbstractContextManager[object]
    dp_rank: int
    dp_size: int
    loss_weight: float  # 1 on the one rank of each dp index that contributes the loss (as for training's)
    global_batch: int
    micro_batch: int


def evaluate(ctx: EvalContext, batches: int, on_batch: Callable[[], None] | None = None) -> EvalResult:
    """The mean loss over `batches` global batches of the validation stream; a collective (every rank calls it).
    `on_batch` runs after each batch (the progress watchdog's beat: a long evaluation is not a hang)."""
    began = time.perf_counter()
    loader = SampleLoader(ctx.source)  # its own position: always from the first validation sample
    was_training = ctx.model.training
    ctx.model.eval()
    try:
        with torch.no_grad():
            total = torch.zeros((), device=ctx.device)
            for _ in range(batches):
                micro = loader.next_microbatches(ctx.dp_rank, ctx.dp_size, ctx.global_batch, ctx.micro_batch)
                total += _rank_loss(ctx.model, micro, ctx.device, ctx.autocast)
                if on_batch is not None:
                    on_batch()
            total *= ctx.loss_weight
            dist.all_reduce(total)
    finally:
        ctx.model.train(was_training)
    return EvalResult(loss=total.item() / (ctx.dp_size * batches), seconds=time.perf_counter() - began)
