"""model.json at the start of a run: a checkpoint directory that cannot be written must not crash rank 0 (a CRASH
exit spends a restart on each try); the checkpointer's own failure report says why, and training goes on."""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from flywheel.spec import parse_job
from flywheel.trainer import train_loop
from flywheel.trainer.models import hf_export
from flywheel.trainer.models.registry import model_shape

_JOB = """apiVersion: flywheel.dev/v1alpha1
kind: TrainingJob
metadata: {name: x}
spec:
  trainer:
    model: {preset: null, layers: 1, dim: 16, heads: 2, vocab: 32, seqLen: 8}
"""


def _record(directory: Path) -> None:
    job = parse_job(yaml.safe_load(_JOB))
    hf_export.record_model(directory, model_shape(job.spec.trainer.model), None, job.spec.trainer.data)


def test_the_worker_writes_model_json_through_the_guarded_call() -> None:
    assert train_loop.record_model is hf_export.record_model


def test_model_json_is_written(tmp_path: Path) -> None:
    _record(tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / hf_export.MODEL_RECORD).read_text())["shape"]["dim"] == 16


@pytest.mark.parametrize("cause", ["read-only", "not-a-directory"])
def test_an_unwritable_checkpoint_directory_is_a_warning_not_a_crash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, cause: str) -> None:
    if cause == "read-only":  # root ignores permission bits: the write itself fails as on a read-only mount
        directory = tmp_path / "ckpt"
        write_text = Path.write_text

        def read_only(self: Path, *args: Any, **kwargs: Any) -> int:
            if self.name == hf_export.MODEL_RECORD:
                raise OSError(errno.EROFS, "Read-only file system", str(self))
            return write_text(self, *args, **kwargs)

        monkeypatch.setattr(Path, "write_text", read_only)
    else:
        (tmp_path / "file").write_text("")
        directory = tmp_path / "file" / "ckpt"
    with caplog.at_level(logging.WARNING, logger="flywheel.trainer"):
        _record(directory)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert hf_export.MODEL_RECORD in warning and str(directory) in warning
