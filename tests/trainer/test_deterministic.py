"""training.deterministic means deterministic kernels on every device, and a kernel that has none is a user error
naming the field (on an H200, warn_only had kept memory-efficient attention's non-deterministic backward, so a
resumed run's parameters differed from an unkilled run's: bench/results/gpu_check.json)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from flywheel import exitcodes
from flywheel.eventlog import Failure, read_records
from flywheel.spec import Training
from flywheel.trainer import train_loop
from tests.trainer.workers import free_port, job_spec


@pytest.fixture
def restore_determinism() -> Iterator[None]:
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@pytest.mark.usefixtures("restore_determinism")
@pytest.mark.parametrize("cuda", [False, True])
def test_deterministic_training_never_only_warns(monkeypatch: pytest.MonkeyPatch, cuda: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    torch.use_deterministic_algorithms(False)
    train_loop.use_deterministic_algorithms(Training(deterministic=True))
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()


@pytest.mark.usefixtures("restore_determinism")
def test_non_deterministic_training_leaves_the_kernels_alone() -> None:
    torch.use_deterministic_algorithms(False)
    train_loop.use_deterministic_algorithms(Training(deterministic=False))
    assert not torch.are_deterministic_algorithms_enabled()


@pytest.mark.usefixtures("restore_determinism")
def test_a_kernel_without_a_deterministic_version_is_a_user_error_naming_the_field(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch's own words (CPU kernels all have a deterministic version, so the failing kernel is simulated).
    message = ("index_add_cuda_ does not have a deterministic implementation, but you set "
               "'torch.use_deterministic_algorithms(True)'.")

    def train(*_: Any, **__: Any) -> int:
        raise RuntimeError(message)

    monkeypatch.setattr(train_loop, "train", train)
    events = tmp_path / "events.jsonl"
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "FLYWHEEL_SPEC": json.dumps(job_spec(1)),
           "FLYWHEEL_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "FLYWHEEL_EVENTS_FILE": str(events)}
    for key, value in env.items():  # init_process_group reads the process env
        monkeypatch.setenv(key, value)
    assert train_loop.main(env) == exitcodes.USER_ERROR
    [failure] = [r for r in read_records(events) if isinstance(r, Failure)]
    assert failure.kind == "user-error"
    assert "training.deterministic" in failure.reason and "index_add_cuda_" in failure.reason
    assert "deterministic: false" in failure.reason
