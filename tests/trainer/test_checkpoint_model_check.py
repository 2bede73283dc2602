"""A checkpoint directory holding another model than trainer.model is refused before anything loads: every rank
exits USER_ERROR at the first start with what differs, the checkpoints and their model.json stay as they were.
Without the check, a shallower model "resumed" from a deeper one's checkpoint silently (DCP loads only the keys
asked for) and a wider one crashed on one tensor, retried. A change that keeps every tensor resumes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flywheel.contracts import exitcodes
from flywheel.trainer.checkpoint.model_check import mismatch
from flywheel.trainer.models import hf_export
from tests.trainer import workers

BLOCK = {"ln.weight": (8,), "attn.weight": (24, 8)}


def _model(blocks: int, dim: int = 8) -> dict[str, tuple[int, ...]]:
    tensors = {"model.tok_emb.weight": (32, dim), "model.head.weight": (32, dim)}
    for i in range(blocks):
        tensors |= {f"model.blocks.{i}.{name}": (shape[0] * dim // 8, *shape[1:]) for name, shape in BLOCK.items()}
    return tensors


def test_the_same_tensors_are_no_mismatch() -> None:
    assert mismatch(_model(2), dict(reversed(_model(2).items()))) is None


@pytest.mark.parametrize(("saved", "here"), [(3, 2), (2, 3)])
def test_another_depth_is_said_as_the_number_of_blocks(saved: int, here: int) -> None:
    assert mismatch(_model(saved), _model(here)) == f"{saved} blocks saved, {here} in this model"


def test_another_width_names_the_first_tensors_and_counts_the_rest() -> None:
    what = mismatch(_model(2, dim=8), _model(2, dim=16))
    assert what == ("6 tensors differ in shape (model.tok_emb.weight [32, 8] saved, [32, 16] here, "
                    "model.head.weight [32, 8] saved, [32, 16] here, ... 4 more)")


def test_renamed_tensors_are_said_from_both_sides() -> None:
    saved = _model(1) | {"model.pos_emb.weight": (64, 8)}
    here = {k.replace("head", "lm_head"): v for k, v in _model(1).items()}
    what = mismatch(saved, here)
    assert what == ("the checkpoint lacks 1 of the model's tensors (model.lm_head.weight); it holds 2 the model "
                    "lacks (model.head.weight, model.pos_emb.weight)")


# ---- the trainer: ranks started as plain processes -----------------------------------------------------------------


def _spec(world: int, model: dict[str, Any], steps: int, **parallelism: Any) -> dict[str, Any]:
    spec = workers.job_spec(world, steps=steps, every_steps=2)
    spec["trainer"]["model"] = model
    spec["trainer"]["parallelism"] |= parallelism
    return spec


def _run(tmp_path: Path, name: str, ckpt: Path, spec: dict[str, Any], world: int) -> tuple[list[int], Path]:
    workdir = tmp_path / name
    codes = workers.run(world, spec, workdir, extra_env={"FLYWHEEL_CHECKPOINT_DIR": str(ckpt)})
    return codes, workdir


def _refusal(workdir: Path) -> str:
    [reason] = {e["reason"] for e in workers.events(workdir) if e["event"] == "user_error"}
    return reason


def test_a_checkpoint_of_another_depth_is_refused_on_every_rank_and_kept(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    deeper = {"preset": "gpt-tiny", "layers": 4}
    codes, saved = _run(tmp_path, "save", ckpt, _spec(2, deeper, 4), 2)
    assert codes == [0, 0], workers.logs(saved)
    record = (ckpt / hf_export.MODEL_RECORD).read_text()
    folders = sorted(p.name for p in ckpt.iterdir())

    # Pipeline ranks each hold some blocks: the model's tensors are every rank's together.
    codes, refused = _run(tmp_path, "shallower", ckpt, _spec(2, {"preset": "gpt-tiny", "layers": 2}, 6, pp=2), 2)
    assert codes == [exitcodes.USER_ERROR] * 2, workers.logs(refused)
    reason = _refusal(refused)
    assert f"checkpoint.dir {ckpt} holds another model than trainer.model (newest checkpoint: step 4)" in reason
    assert "4 blocks saved, 2 in this model" in reason and "start afresh" in reason, reason
    assert not [e for e in workers.events(refused) if e["event"] in ("restore", "step")]
    assert (ckpt / hf_export.MODEL_RECORD).read_text() == record  # export still names the saved model
    assert sorted(p.name for p in ckpt.iterdir()) == folders

    codes, resumed = _run(tmp_path, "same", ckpt, _spec(2, deeper, 6, pp=2), 2)
    assert codes == [0, 0], workers.logs(resumed)
    assert [e["step"] for e in workers.events(resumed) if e["event"] == "restore"] == [4]


def test_a_checkpoint_of_another_width_is_refused_with_its_shapes(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    codes, saved = _run(tmp_path, "save", ckpt, _spec(1, {"preset": "gpt-tiny"}, 2), 1)
    assert codes == [0], workers.logs(saved)
    codes, refused = _run(tmp_path, "wider", ckpt, _spec(1, {"preset": "gpt-tiny", "dim": 96}, 4), 1)
    assert codes == [exitcodes.USER_ERROR], workers.logs(refused)
    assert "tensors differ in shape (model.tok_emb.weight [256, 64] saved, [256, 96] here" in _refusal(refused)
    assert json.loads((ckpt / hf_export.MODEL_RECORD).read_text())["shape"]["dim"] == 64


def test_a_change_that_keeps_every_tensor_resumes(tmp_path: Path) -> None:
    """A llama's rotary positions have no parameters: another seqLen keeps every tensor."""
    ckpt = tmp_path / "ckpt"
    codes, saved = _run(tmp_path, "save", ckpt, _spec(1, {"preset": "llama-tiny"}, 2), 1)
    assert codes == [0], workers.logs(saved)
    codes, resumed = _run(tmp_path, "shorter", ckpt, _spec(1, {"preset": "llama-tiny", "seqLen": 32}, 4), 1)
    assert codes == [0], workers.logs(resumed)
    assert [e["step"] for e in workers.events(resumed) if e["event"] == "restore"] == [2]
