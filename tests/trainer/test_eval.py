"""Evaluation: the validation stream (held-out windows, a validation file, the synthetic held-out stream), when an
evaluation is due, and `evaluate` itself: the same loss under every layout (tp, pp, dp) within the parity tolerance,
and training bitwise unchanged by evaluating after every step."""

from __future__ import annotations

import math
from contextlib import nullcontext

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from flywheel.spec.job import ModelSpec
from flywheel.trainer.data import (
    DataError,
    HeldOutWindows,
    SyntheticSource,
    TokenFileSource,
    build_source,
    build_validation_source,
    held_out_windows,
)
from flywheel.trainer.evaluate import EvalContext, EvalPlan, evaluate, perplexity
from flywheel.trainer.models.registry import build_model
from tests.parallel.harness import loss_relative_difference, run_layout

SEQ = 8


def token_file(tmp_path, n: int = 8 * 20 + 1):
    path = tmp_path / "tokens.npy"
    np.save(path, np.arange(n, dtype=np.uint16) % 200)
    return path


def test_held_out_windows_are_the_last_and_never_trained(tmp_path):
    assert held_out_windows(100, 0.0) == 0 and held_out_windows(100, 0.1) == 10 and held_out_windows(5, 0.01) == 1
    with pytest.raises(DataError, match="data.validationFraction 0.5 .* leaves nothing to train on"):
        held_out_windows(1, 0.5)
    train = TokenFileSource(str(token_file(tmp_path)), 256, SEQ, seed=0, held_out_fraction=0.1)
    assert (train.windows, train.held_out) == (18, 2)
    starts = {int(train.sample(i)[0]) for i in range(3 * train.windows)}  # three epochs
    held = build_validation_source(None, train, 256, 0)
    assert isinstance(held, HeldOutWindows)
    held_starts = [int(held.sample(i)[0]) for i in range(4)]
    assert held_starts == [18 * SEQ, 19 * SEQ, 18 * SEQ, 19 * SEQ]  # in order, wrapping
    assert starts.isdisjoint(held_starts) and len(starts) == 18
    assert np.array_equal(held.sample(1), np.arange(19 * SEQ, 20 * SEQ + 1) % 200)


def test_validation_source_kinds_and_errors(tmp_path):
    path = token_file(tmp_path)
    synthetic = build_source("synthetic", 64, SEQ, 0)
    held = build_validation_source(None, synthetic, 64, 0)
    assert isinstance(held, SyntheticSource) and not np.array_equal(held.sample(0), synthetic.sample(0))
    assert np.array_equal(held.sample(3), build_validation_source(None, synthetic, 64, 0).sample(3))
    given = build_validation_source(str(path), synthetic, 256, 0)
    assert isinstance(given, TokenFileSource) and given.held_out == 0
    with pytest.raises(DataError, match="data.validation: .*does not exist"):
        build_validation_source(str(tmp_path / "gone.bin"), synthetic, 256, 0)
    with pytest.raises(DataError, match="set data.validation .* or data.validationFraction"):
        build_validation_source(None, build_source(str(path), 256, SEQ, 0), 256, 0)


def test_eval_plan_is_due_every_n_steps_and_at_the_last():
    plan = EvalPlan(every_steps=4, batches=2, last_step=10)
    assert [s for s in range(1, 11) if plan.due(s)] == [4, 8, 10]
    assert not any(EvalPlan(0, 2, 10).due(s) for s in range(1, 11))
    assert perplexity(1.0) == pytest.approx(math.e) and perplexity(1e6) == math.inf


@pytest.fixture()
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_evaluate_is_the_mean_loss_and_touches_nothing(one_rank_group):
    cfg = ModelSpec.model_validate({"preset": "llama-tiny", "seqLen": 16}).shape()
    model = build_model(cfg, seed=0)
    source = build_validation_source(None, build_source("synthetic", cfg.vocab, cfg.seq_len, 0), cfg.vocab, 0)
    ctx = EvalContext(model=model, source=source, device=torch.device("cpu"), autocast=nullcontext(), dp_rank=0,
                      dp_size=1, loss_weight=1.0, global_batch=4, micro_batch=2)
    rng = torch.get_rng_state()
    result = evaluate(ctx, batches=2)
    assert torch.equal(torch.get_rng_state(), rng) and model.training
    assert all(p.grad is None for p in model.parameters())
    samples = torch.from_numpy(np.stack([source.sample(i) for i in range(8)]))
    with torch.no_grad():
        logits = model(samples[:, :-1])
    expected = F.cross_entropy(logits.flatten(0, 1), samples[:, 1:].flatten()).item()
    assert result.loss == pytest.approx(expected, rel=1e-6)
    beats: list[int] = []
    assert evaluate(ctx, batches=2, on_batch=lambda: beats.append(1)).loss == result.loss  # the same samples
    assert beats == [1, 1]  # the watchdog hears from a long evaluation


LLAMA = {"preset": "llama-tiny", "seqLen": 32}
OPTIONS = {"steps": 3, "lr": 1.0, "gradClip": 0.5, "model": LLAMA}


@pytest.mark.slow
def test_eval_loss_agrees_across_layouts_and_leaves_training_bitwise(tmp_path):
    plain = run_layout(1, tmp_path / "plain", **OPTIONS)
    reference = run_layout(1, tmp_path / "ref", evalSteps=2, **OPTIONS)
    assert reference["losses"] == plain["losses"]  # evaluating after every step changed nothing in training
    assert torch.equal(reference["params"]["tok_emb.weight"], plain["params"]["tok_emb.weight"])
    assert len(set(reference["eval_losses"].values())) == 3  # it learns, and eval sees it
    for layout in ({"pp": 2, "schedule": "1f1b"}, {"tp": 2}, {"fsdp": False}):
        result = run_layout(2, tmp_path / "-".join(map(str, layout.values())), parallelism=layout, evalSteps=2,
                            **OPTIONS)
        assert loss_relative_difference(result["eval_losses"], reference["eval_losses"]) < 1e-5, layout
