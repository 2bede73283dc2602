"""bf16 under FSDP2: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), fp32 master weights, no autocast."""

from __future__ import annotations

import math

import torch

from flywheel.layout.rules import dp_wrapper
from flywheel.spec.job import Parallelism, Training
from flywheel.trainer.distributed.parallelize import BF16_POLICY, fsdp_mixed_precision

from .harness import run_layout


def test_bf16_uses_fsdp_mixed_precision_only_for_fsdp_without_pipeline():
    bf16 = Training(precision="bf16")
    assert fsdp_mixed_precision(Parallelism(fsdp=True), bf16, dp_size=2)
    assert not fsdp_mixed_precision(Parallelism(fsdp=False), bf16, dp_size=2)  # DDP: autocast
    assert not fsdp_mixed_precision(Parallelism(fsdp=True, pp=2), bf16, dp_size=2)
    assert not fsdp_mixed_precision(Parallelism(fsdp=True), Training(precision="fp32"), dp_size=2)
    assert not fsdp_mixed_precision(Parallelism(fsdp=True), bf16, dp_size=1)  # no wrapper over one rank: autocast
    assert (BF16_POLICY.param_dtype, BF16_POLICY.reduce_dtype) == (torch.bfloat16, torch.float32)


def test_a_dp_group_of_one_gets_no_wrapper_unless_tensor_parallel():
    assert dp_wrapper(fsdp=True, dp=1, tp=1) is None and dp_wrapper(fsdp=False, dp=1, tp=1) is None
    assert dp_wrapper(fsdp=True, dp=1, tp=2) == "fsdp"  # every parameter a DTensor, as the fused AdamW needs
    assert dp_wrapper(fsdp=True, dp=2, tp=1) == "fsdp" and dp_wrapper(fsdp=False, dp=2, tp=1) == "ddp"


def test_bf16_fsdp_run_trains_with_fp32_master_weights(tmp_path):
    options = {"parallelism": {"fsdp": True}, "steps": 8, "lr": 0.5, "model": {"preset": "llama-tiny"}}
    bf16 = run_layout(2, tmp_path / "bf16", precision="bf16", **options)
    fp32 = run_layout(2, tmp_path / "fp32", **options)
    losses = [bf16["losses"][step] for step in sorted(bf16["losses"])]
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0] - 0.1
    assert all(p.dtype == torch.float32 for p in bf16["params"].values())  # the master weights
    assert bf16["losses"] != fp32["losses"]  # it did compute in bf16
    assert abs(losses[-1] - fp32["losses"][8]) < 0.1 * fp32["losses"][8]
