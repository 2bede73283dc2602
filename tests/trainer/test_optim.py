import copy
import math

import pytest
import torch

from flywheel.spec.job import Training
from flywheel.trainer.models.gpt.model import GPT, GPTConfig
from flywheel.trainer.optim import build_optimizer, build_scheduler, lr_factor


def lrs(training: Training) -> list[float]:
    """The lr each optimizer step 1..steps uses."""
    model = torch.nn.Linear(2, 2)
    optimizer = build_optimizer(model, training)
    scheduler = build_scheduler(optimizer, training)
    out = []
    for _ in range(training.steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_linear_warmup_then_cosine_to_the_floor():
    training = Training(steps=20, lr=1e-3, warmup_steps=4, min_lr_ratio=0.1)
    schedule = lrs(training)
    assert schedule[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert schedule[4] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(schedule[4:], schedule[5:]))  # monotone decay
    assert schedule[-1] == pytest.approx(1e-4)  # exactly minLrRatio * lr at the last step
    midpoint = 4 + (20 - 4 - 1) / 2
    assert lr_factor(int(midpoint), warmup_steps=4, total_steps=20, min_lr_ratio=0.1) == pytest.approx(
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (int(midpoint) - 4) / 15)))


def test_no_warmup_and_single_step():
    assert lrs(Training(steps=5, lr=1.0, warmup_steps=0, min_lr_ratio=0.0))[0] == pytest.approx(1.0)
    assert lrs(Training(steps=1, lr=1.0, warmup_steps=0))[0] == pytest.approx(1.0)


def test_scheduler_state_does_not_pin_the_schedule():
    """A resume with more steps follows the new spec's schedule, not the one saved in the checkpoint."""
    short = Training(steps=10, warmup_steps=0)
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, short)
    sched = build_scheduler(opt, short)
    for _ in range(5):
        opt.step()
        sched.step()
    longer = Training(steps=100, warmup_steps=0)
    opt2 = build_optimizer(model, longer)
    opt2.load_state_dict(opt.state_dict())
    sched2 = build_scheduler(opt2, longer)
    sched2.load_state_dict(sched.state_dict())
    opt2.step()
    sched2.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(longer.lr * lr_factor(6, warmup_steps=0, total_steps=100,
                                                                               min_lr_ratio=longer.min_lr_ratio))


def test_weight_decay_only_on_matrices():
    model = GPT(GPTConfig(layers=1, dim=16, heads=2, vocab=32, seq_len=8))
    decayed, plain = build_optimizer(model, Training(weight_decay=0.1)).param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decayed["params"]) and all(p.ndim == 1 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        inputs = torch.randn(4, 16, generator=torch.Generator().manual_seed(step))
        model(inputs).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))


def test_adamw_is_torchs_fused_kernel_where_the_device_has_one():
    optimizer = build_optimizer(_model(), Training())
    assert optimizer.defaults["fused"] is True and not optimizer.defaults["foreach"]
    meta = torch.nn.Linear(2, 2, device="meta")
    assert build_optimizer(meta, Training()).defaults["foreach"] is True  # no fused kernel for this device


def test_the_fused_update_repeats_bitwise_and_resumes_bitwise():
    runs = []
    for _ in range(2):
        model = _model()
        _train(model, build_optimizer(model, Training()), range(6))
        runs.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    # Stopped after 3 steps, rebuilt from the saved state: the next 3 steps end bitwise where the run did.
    model = _model()
    optimizer = build_optimizer(model, Training())
    _train(model, optimizer, range(3))
    saved_model, saved_optimizer = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    resumed = _model()
    resumed.load_state_dict(saved_model)
    resumed_optimizer = build_optimizer(resumed, Training())
    resumed_optimizer.load_state_dict(saved_optimizer)
    _train(resumed, resumed_optimizer, range(3, 6))
    assert all(torch.equal(a, b) for a, b in zip(runs[0], resumed.parameters()))
