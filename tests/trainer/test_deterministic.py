"""training.deterministic means deterministic kernels on every device, and a kernel that has none is a user error
naming the field (on an H200, warn_only had kept memory-efficient attention's non-deterministic backward, so a
resumed run's parameters differed from an unkilled run's: bench/results/gpu_check.json)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from flywheel.contracts import exitcodes
from flywheel.eventlog import Failure, read_records
from flywheel.spec.job import Training
from flywheel.trainer import entry
from tests.trainer.workers import REPO, free_port, job_spec


@pytest.fixture
def restore_determinism() -> Iterator[None]:
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.utils.deterministic.fill_uninitialized_memory = fill


@pytest.mark.usefixtures("restore_determinism")
@pytest.mark.parametrize("cuda", [False, True])
def test_deterministic_training_never_only_warns(monkeypatch: pytest.MonkeyPatch, cuda: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    torch.use_deterministic_algorithms(False)
    entry.use_deterministic_algorithms(Training(deterministic=True))
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert not torch.utils.deterministic.fill_uninitialized_memory  # no NaN pass over every torch.empty


@pytest.mark.usefixtures("restore_determinism")
def test_non_deterministic_training_leaves_the_kernels_alone() -> None:
    torch.use_deterministic_algorithms(False)
    entry.use_deterministic_algorithms(Training(deterministic=False))
    assert not torch.are_deterministic_algorithms_enabled()


# Run in its own process: main() sets process-wide state (the collective env, signal handlers, the process group).
_MAIN_WITH_A_FAILING_KERNEL = """
import sys
from flywheel.trainer import entry

def train(*_, **__):
    raise RuntimeError("index_add_cuda_ does not have a deterministic implementation, but you set "
                       "'torch.use_deterministic_algorithms(True)'.")

entry.train = train
sys.exit(entry.main())
"""


def test_a_kernel_without_a_deterministic_version_is_a_user_error_naming_the_field(tmp_path: Path) -> None:
    # torch's own words (CPU kernels all have a deterministic version, so the failing kernel is simulated).
    events = tmp_path / "events.jsonl"
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "FLYWHEEL_SPEC": json.dumps(job_spec(1)), "PYTHONPATH": str(REPO),
           "FLYWHEEL_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "FLYWHEEL_EVENTS_FILE": str(events)}
    done = subprocess.run([sys.executable, "-c", _MAIN_WITH_A_FAILING_KERNEL], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == exitcodes.USER_ERROR, done.stderr[-2000:]
    [failure] = [r for r in read_records(events) if isinstance(r, Failure)]
    assert failure.kind == "user-error"
    assert "training.deterministic" in failure.reason and "index_add_cuda_" in failure.reason
    assert "deterministic: false" in failure.reason
