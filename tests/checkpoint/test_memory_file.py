"""The memory tier's step file: what is written is read back bit for bit straight into the live tensors (in place),
whatever the dtype or shape; a copy that does not fit the state is refused before any byte is read, and one whose
bytes were damaged after it was written is detected, naming the damaged tensors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from ckpt_helpers import flip_byte

from flywheel.trainer.checkpoint.tiers import memory_file as step_format


def _saved() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {
        "model": {"w": torch.randn(3, 5, generator=g), "b": torch.randn(5, generator=g).to(torch.bfloat16),
                  "mask": torch.tensor([True, False, True]), "empty": torch.zeros(0, 4), "scalar": torch.tensor(7.5)},
        "optim": {"state": {"w": {"step": torch.tensor(3.0), "exp_avg": torch.randn(3, 5, generator=g)}},
                  "param_groups": [{"lr": 0.1, "params": ["w"]}]},
        "rng": {"torch": torch.get_rng_state(), "cuda": [torch.arange(4, dtype=torch.uint8)],
                "numpy": ("MT19937", np.arange(3), 1)},
        "step": 12,
    }


def _template() -> dict[str, Any]:
    """The live state of a fresh process: same shapes, other values."""
    saved = _saved()
    zeroed: Any = torch.utils._pytree.tree_map(
        lambda x: torch.full_like(x, 0) if isinstance(x, torch.Tensor) else x, saved)
    zeroed["step"] = -1
    return zeroed


def _restore(path: Path, template: dict[str, Any]) -> dict[str, Any]:
    fd = os.open(path, os.O_RDONLY)
    try:
        header, _ = step_format.read_header(fd)
        state, targets = step_format.resolve(template, header.state)
        step_format.read_into(fd, header, targets, f"the memory copy {path}")
    finally:
        os.close(fd)
    assert (header.step, header.world_size, header.rank) == (12, 2, 1)
    return state


def test_a_step_file_is_read_back_bitwise_into_the_live_tensors_in_place(tmp_path: Path) -> None:
    path = tmp_path / "step.bin"
    saved = _saved()
    step_format.write(path, 12, 2, 1, saved)
    template = _template()
    live_w, live_b = template["model"]["w"], template["model"]["b"]
    state = _restore(path, template)
    assert state["model"]["w"] is live_w and state["model"]["b"] is live_b  # filled in place
    assert state["step"] == 12 and state["optim"]["param_groups"] == saved["optim"]["param_groups"]
    flat_saved, _ = torch.utils._pytree.tree_flatten(saved)
    flat_state, _ = torch.utils._pytree.tree_flatten(state)
    for want, got in zip(flat_saved, flat_state, strict=True):
        if isinstance(want, torch.Tensor):
            assert got.dtype == want.dtype and torch.equal(got, want)
        elif isinstance(want, np.ndarray):
            assert np.array_equal(got, want)
        else:
            assert got == want


def test_a_tensor_the_state_lacks_or_holds_non_contiguous_is_still_restored(tmp_path: Path) -> None:
    path = tmp_path / "step.bin"
    step_format.write(path, 12, 2, 1, _saved())
    template = _template()
    del template["optim"]["state"]["w"]["exp_avg"]  # e.g. optimizer state not created yet in the fresh process
    template["model"]["w"] = torch.zeros(5, 3).t()  # a transposed view: bytes cannot land in it directly
    state = _restore(path, template)
    assert torch.equal(state["optim"]["state"]["w"]["exp_avg"], _saved()["optim"]["state"]["w"]["exp_avg"])
    assert torch.equal(state["model"]["w"], _saved()["model"]["w"])


@pytest.mark.parametrize("change,message", [
    (lambda t: t["model"].__setitem__("w", torch.zeros(5, 3)), "memory copy of .model.w is (3, 5)"),
    (lambda t: t["model"].__setitem__("b", torch.zeros(5)), "torch.bfloat16, the state holds (5,) torch.float32"),
    (lambda t: t["model"].__setitem__("extra", torch.zeros(1)), "memory copy lacks ['extra'] under .model"),
])
def test_a_copy_that_does_not_fit_the_state_is_refused(tmp_path: Path, change: Any, message: str) -> None:
    path = tmp_path / "step.bin"
    step_format.write(path, 12, 2, 1, _saved())
    template = _template()
    change(template)
    with pytest.raises(ValueError, match="memory copy") as err:
        _restore(path, template)
    assert message in str(err.value)


def test_a_foreign_or_truncated_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "step.bin"
    torch.save({"a": 1}, path)
    with pytest.raises(ValueError, match="bad magic"):
        _restore(path, _template())
    step_format.write(path, 12, 2, 1, _saved())
    os.truncate(path, path.stat().st_size - 8)
    with pytest.raises(ValueError, match="ends early"):
        _restore(path, _template())


@pytest.mark.parametrize("name", ["model.w", "model.b", "model.scalar", "model.mask",
                                  "optim.state.w.exp_avg", "rng.torch", "rng.cuda[0]"])
def test_a_flipped_byte_in_a_tensor_is_detected_naming_that_tensor(tmp_path: Path, name: str) -> None:
    path = tmp_path / "step.bin"
    step_format.write(path, 12, 2, 1, _saved())
    fd = os.open(path, os.O_RDONLY)
    try:
        header, _ = step_format.read_header(fd)
    finally:
        os.close(fd)
    _, targets = step_format.resolve(_template(), header.state)
    [ref] = [t.ref for t in targets if t.name.lstrip(".") == name]
    flip_byte(path, header.data_start + ref.offset + ref.nbytes - 1)  # its last byte
    with pytest.raises(step_format.DamagedCopy) as err:
        _restore(path, _template())
    assert err.value.names == [name]
    assert f"the memory copy {path} is damaged: xxh3 of {name} does not match its digest" == str(err.value)


def test_a_flipped_byte_in_the_header_is_detected_before_it_is_unpickled(tmp_path: Path) -> None:
    path = tmp_path / "step.bin"
    step_format.write(path, 12, 2, 1, _saved())
    flip_byte(path, len(step_format.MAGIC) + 8 + 40)
    with pytest.raises(step_format.DamagedCopy, match="header is damaged"):
        _restore(path, _template())
