"""The model's head + loss (models/lm_loss.py): the default path is bitwise the loss and gradients the step computed
before it moved into the model; `chunkedLoss` (torch's linear_cross_entropy) is equal within rounding, bitwise
repeatable, and a run stopped and resumed from its state ends bitwise where the uninterrupted one did."""

from __future__ import annotations

import copy
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

from flywheel.spec.job import ModelSpec, Training
from flywheel.trainer.distributed.parallelize import apply_loss
from flywheel.trainer.models.registry import build_model
from flywheel.trainer.optim import build_optimizer

PRESETS = ["gpt-tiny", "llama-tiny"]


def _batch(vocab: int, seq: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, vocab, (2, seq + 1), generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1], tokens[:, 1:]


def _loss_and_grads(model: torch.nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return [loss.detach(), *(p.grad.clone() for p in model.parameters())]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_the_default_loss_is_bitwise_the_one_computed_outside_the_model(preset, bf16):
    model = build_model(ModelSpec(preset=preset).shape())
    inputs, targets = _batch(model.cfg.vocab, model.cfg.seq_len)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()
    with autocast:  # as the step computed it before: logits out of the model, the loss outside autocast
        logits = model(inputs)
    before = _loss_and_grads(model, F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()))
    with autocast:
        now = _loss_and_grads(model, model(inputs, targets))
    assert all(torch.equal(a, b) for a, b in zip(before, now))


@pytest.mark.parametrize("preset", PRESETS)
def test_the_chunked_loss_is_close_and_repeats_bitwise(preset):
    model = build_model(ModelSpec(preset=preset).shape())
    inputs, targets = _batch(model.cfg.vocab, model.cfg.seq_len)
    full = _loss_and_grads(model, model(inputs, targets))
    apply_loss(model, Training(chunked_loss=True))
    chunked = [_loss_and_grads(model, model(inputs, targets)) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*chunked))
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(full, chunked[0]))


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> list[float]:
    losses = []
    for step in steps:
        inputs, targets = _batch(model.cfg.vocab, model.cfg.seq_len, seed=step)
        loss = model(inputs, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _chunked_model() -> torch.nn.Module:
    model = build_model(ModelSpec(preset="llama-tiny").shape(), seed=0)
    apply_loss(model, Training(chunked_loss=True))
    return model


def test_a_chunked_loss_run_resumes_bitwise():
    model = _chunked_model()
    whole = _train(model, build_optimizer(model, Training()), range(6))
    stopped = _chunked_model()
    optimizer = build_optimizer(stopped, Training())
    first = _train(stopped, optimizer, range(3))
    saved_model, saved_optimizer = copy.deepcopy(stopped.state_dict()), copy.deepcopy(optimizer.state_dict())
    resumed = _chunked_model()
    resumed.load_state_dict(saved_model)
    resumed_optimizer = build_optimizer(resumed, Training())
    resumed_optimizer.load_state_dict(saved_optimizer)
    assert first + _train(resumed, resumed_optimizer, range(3, 6)) == whole
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), resumed.parameters()))
