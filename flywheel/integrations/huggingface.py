"""The Hugging Face `transformers.Trainer` callback (the `hf-trainer` extra). Two lines in a Trainer script:

    from flywheel.integrations.huggingface import FlywheelCallback
    trainer = Trainer(..., callbacks=[FlywheelCallback()])

Each optimizer step goes to `flywheel.progress` (with the loss the Trainer logs, every `logging_steps`, and the
tokens when `include_num_input_tokens_seen` is on), each completed `save_steps` checkpoint as a checkpoint, and a
run resumed with `resume_from_checkpoint` says from which step and folder. Outside Flywheel it does nothing.
`checkpoint_dir(default)` is where the job keeps checkpoints (FLYWHEEL_CHECKPOINT_DIR): the Trainer's
`output_dir` there outlives a worker.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from flywheel.integrations.steps import StepClock, checkpoint_dir

__all__ = ["FlywheelCallback", "checkpoint_dir"]


def checkpoint_folder(args: TrainingArguments, step: int) -> str:
    """The folder the Trainer saves step `step` in (its own naming: `<output_dir>/checkpoint-<step>`)."""
    return os.path.join(args.output_dir or "", f"{PREFIX_CHECKPOINT_DIR}-{step}")


class FlywheelCallback(TrainerCallback):
    def __init__(self) -> None:
        self.clock = StepClock()

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        self.clock.tokens_seen = int(state.num_input_tokens_seen or 0)
        # global_step above 0: the state of a checkpoint was loaded (resume_from_checkpoint)
        folder = checkpoint_folder(args, state.global_step)
        self.clock.begin(state.global_step, folder if os.path.isdir(folder) else "")

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        self.clock.finished(state.global_step, int(state.num_input_tokens_seen or 0) or None)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            self.clock.loss(float(logs["loss"]))

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        self.clock.saved(state.global_step, checkpoint_folder(args, state.global_step))

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self.clock.flush()
