"""A pretrained model's shape for the planner: `trainer.model.pretrained`'s config.json, mapped by the trainer's own
(torch-free) Hugging Face mapping (`flywheel/layout/hf_config.py`), so the planner sizes exactly the model the
workers build. The planner's one read: the file is read where the job is planned (`flywheel plan`/`run`, or the
operator when it validates a `parallelism.auto` job), so there the directory must be readable."""

from __future__ import annotations

import json
from pathlib import Path

from flywheel.layout.hf_config import HFConfigError, shape_from_config
from flywheel.layout.rules import Problem
from flywheel.layout.shape import ModelShape

FIELD = "trainer.model.pretrained"


class PretrainedShapeError(ValueError):
    """config.json cannot be read here or describes a model the trainer cannot build; `problem` says which."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        super().__init__(str(problem))


def pretrained_shape(directory: str, seq_len: int | None) -> ModelShape:
    """The shape of the model in `directory` (its config.json) trained at `seq_len` (None: the config's default)."""
    path = Path(directory) / "config.json"
    try:
        config = json.loads(path.read_text())
    except OSError as err:
        raise PretrainedShapeError(Problem(
            "plan-pretrained", FIELD, f"parallelism.auto sizes the model from {path}, which cannot be read where the "
            f"job is planned ({err.strerror})", "make the directory readable here (on a cluster: where the operator "
            "runs), or set parallelism tp/pp/fsdp yourself instead of auto")) from None
    except json.JSONDecodeError as err:
        raise PretrainedShapeError(Problem("plan-pretrained", FIELD, f"{path} is not JSON ({err})",
                                           "give a Hugging Face model directory")) from None
    if not isinstance(config, dict):
        raise PretrainedShapeError(Problem("plan-pretrained", FIELD, f"{path} is not a JSON object",
                                           "give a Hugging Face model directory"))
    try:
        return shape_from_config(config, seq_len)
    except HFConfigError as err:
        raise PretrainedShapeError(Problem("plan-pretrained", FIELD, str(err),
                                           "use a config the trainer supports (docs/models.md)")) from None
