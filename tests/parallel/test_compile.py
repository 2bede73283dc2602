"""training.compile: each block torch.compile'd in place (inductor on CPU), same names, same losses within float
tolerance; without a C compiler the run is refused naming the field."""

from __future__ import annotations

import pytest

from flywheel.spec.job import ModelSpec, Training
from flywheel.trainer.distributed import parallelize as parallelize_module
from flywheel.trainer.distributed.parallelize import ParallelismError, apply_compile
from flywheel.trainer.models.registry import build_model

from .harness import loss_relative_difference, run_layout


def test_compiled_blocks_keep_their_parameter_names():
    model = build_model(ModelSpec(preset="llama-tiny").shape())
    names = [name for name, _ in model.named_parameters()]
    apply_compile(model)
    assert [name for name, _ in model.named_parameters()] == names


def test_compile_without_a_c_compiler_is_refused_naming_the_field(monkeypatch):
    monkeypatch.setattr(parallelize_module.shutil, "which", lambda _name: None)
    with pytest.raises(ParallelismError, match="training.compile"):
        apply_compile(build_model(ModelSpec(preset="gpt-tiny").shape()))
    assert Training(compile=True).compile


@pytest.mark.heavy
def test_a_compiled_fsdp_run_matches_the_uncompiled_one(tmp_path):
    options = {"parallelism": {"fsdp": True}, "steps": 4, "model": {"preset": "llama-tiny"}}
    compiled = run_layout(2, tmp_path / "compiled", compile=True, timeout=600, **options)
    plain = run_layout(2, tmp_path / "plain", **options)
    assert loss_relative_difference(compiled["losses"], plain["losses"]) < 1e-4
