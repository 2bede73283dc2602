"""A checkpoint records the model's weights layouts and a restore sets them back: a run resumes in the layout its
weights were trained in, a checkpoint written before layouts were recorded (RoPE's half layout) included, and the
continuation is bitwise the run's own."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_helpers import assert_same_state, full_state

from flywheel.layout.shape import PRESETS
from flywheel.spec.job import CheckpointSpec
from flywheel.trainer.checkpoint import state as checkpoint_state
from flywheel.trainer.checkpoint.manager import Checkpointer
from flywheel.trainer.checkpoint.state import AppState
from flywheel.trainer.models.llama.model import Llama
from flywheel.trainer.models.llama.rope import HALF, INTERLEAVED
from flywheel.trainer.models.weights_layout import LAYOUTS_KEY, layouts_of, set_layouts

pytestmark = pytest.mark.usefixtures("one_rank")

SHAPE = dataclasses.replace(PRESETS["llama-tiny"], seq_len=8)


class Tokens:
    """The batch at a position is a pure function of it."""

    def __init__(self) -> None:
        self.position = 0

    def next_batch(self) -> torch.Tensor:
        self.position += 1
        return torch.randint(0, SHAPE.vocab, (2, SHAPE.seq_len + 1), generator=torch.Generator().manual_seed(
            self.position))

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


def make_app(seed: int, layout: str | None = None) -> tuple[AppState, Tokens]:
    model = Llama(SHAPE, seed=seed)
    if layout is not None:
        set_layouts(model, {"rope": layout})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    data = Tokens()
    return AppState(model, optimizer, scheduler, data, rank=0, world_size=1), data


def train(app: AppState, data: Tokens, steps: int, ckpt: Checkpointer | None = None) -> None:
    for step in range(1, steps + 1):
        tokens = data.next_batch()
        app.model(tokens[:, :-1], tokens[:, 1:]).backward()
        if ckpt is not None:
            ckpt.wait_staged()
        app.optimizer.step()
        app.optimizer.zero_grad(set_to_none=True)
        if ckpt is not None and ckpt.due(step):
            ckpt.save(step, app)


def resumed(tmp_path: Path, layout: str | None = None) -> AppState:
    """A new process's app (the default layout unless `layout`) restored from tmp_path, trained 2 steps more."""
    app, data = make_app(seed=9, layout=layout)
    ckpt = Checkpointer(CheckpointSpec(dir=str(tmp_path), every_steps=100), tmp_path)
    assert ckpt.restore(app) == 2
    train(app, data, 2)
    ckpt.close()
    return app


def run_and_save(tmp_path: Path, layout: str) -> AppState:
    """Trains 4 steps in `layout`, saving at step 2; the app after step 4."""
    app, data = make_app(seed=0, layout=layout)
    ckpt = Checkpointer(CheckpointSpec(dir=str(tmp_path), every_steps=2, keep=1, **{"async": False}), tmp_path)
    train(app, data, 2, ckpt)
    ckpt.close()
    train(app, data, 2)
    return app


def test_a_checkpoint_resumes_in_the_layout_it_was_trained_in(tmp_path: Path) -> None:
    uninterrupted = run_and_save(tmp_path, INTERLEAVED)
    app = resumed(tmp_path, layout=HALF)  # whatever the new process built, the weights' layout wins
    assert layouts_of(app.model) == {"rope": INTERLEAVED}
    assert_same_state(full_state(app), full_state(uninterrupted))


def test_a_checkpoint_from_before_layouts_were_recorded_resumes_in_the_half_layout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written_by_an_older_trainer = AppState.state_dict

    def without_layouts(self: AppState, **kwargs: Any) -> dict[str, Any]:
        state = written_by_an_older_trainer(self, **kwargs)
        del state[LAYOUTS_KEY]
        return state

    monkeypatch.setattr(AppState, "state_dict", without_layouts)
    uninterrupted = run_and_save(tmp_path, HALF)
    monkeypatch.undo()
    app = resumed(tmp_path)  # a new model: interleaved until the restore
    assert layouts_of(app.model) == {"rope": HALF}
    assert_same_state(full_state(app), full_state(uninterrupted))


def test_every_save_records_the_layout(tmp_path: Path) -> None:
    app, _ = make_app(seed=0)
    assert app.state_dict()[LAYOUTS_KEY] == {"rope": INTERLEAVED}
    set_layouts(app.model, {"rope": HALF})
    assert checkpoint_state.AppState.state_dict(app)[LAYOUTS_KEY] == {"rope": HALF}
