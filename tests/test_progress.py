"""flywheel.progress: the user-script progress API publishes the trainer's metric names, labels and step events."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from flywheel import progress
from flywheel.progress import ProgressReporter

LABELS = {"job": "train", "namespace": "ml", "replica": "1", "rank": "2"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env(tmp_path: Path, rank: int, local_rank: int = 0, port: int = 0) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": "4", "FLYWHEEL_JOB": "ml/train",
            "FLYWHEEL_REPLICA_INDEX": "1", "FLYWHEEL_METRICS_PORT": str(port),
            "FLYWHEEL_EVENTS_FILE": str(tmp_path / "events.jsonl")}


def test_metrics_have_the_trainer_names_and_labels(tmp_path: Path) -> None:
    reporter = ProgressReporter(env(tmp_path, rank=2))
    reporter.begin()
    reporter.step(1, loss=2.5, tokens=1000)
    reporter.step(2, loss=2.0)
    registry = reporter.metrics.registry
    assert registry.get_sample_value("flywheel_train_steps_total", LABELS) == 2
    assert registry.get_sample_value("flywheel_train_loss", LABELS) == 2.0
    assert registry.get_sample_value("flywheel_train_last_step_timestamp_seconds", LABELS) > 1.7e9
    assert registry.get_sample_value("flywheel_train_step_seconds_count", LABELS) == 2
    assert registry.get_sample_value("flywheel_train_tokens_per_second", LABELS) > 0
    assert not (tmp_path / "events.jsonl").exists()  # only rank 0 writes step events


def test_a_first_step_without_begin_has_no_made_up_duration(tmp_path: Path) -> None:
    """Timed from the reporter's creation (at that same call) the first step took microseconds and its tokens/s
    read as millions."""
    reporter = ProgressReporter(env(tmp_path, rank=0))
    reporter.step(1, loss=2.5, tokens=1000)
    reporter.step(2, loss=2.0, tokens=1000)
    first, second = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert first["step_seconds"] == 0.0 and first["tokens_per_second"] is None
    assert second["step_seconds"] > 0 and second["tokens_per_second"] > 0
    registry = reporter.metrics.registry
    assert registry.get_sample_value("flywheel_train_step_seconds_count", {**LABELS, "rank": "0"}) == 1


def test_rank_zero_writes_step_events(tmp_path: Path) -> None:
    reporter = ProgressReporter(env(tmp_path, rank=0))
    reporter.step(7, loss=float("nan"))
    [record] = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert record["event"] == "step" and record["step"] == 7 and record["world_size"] == 4
    assert record["loss"] is None  # a diverged loss stays parseable JSON


def test_local_rank_zero_serves_metrics(tmp_path: Path) -> None:
    port = free_port()
    reporter = ProgressReporter(env(tmp_path, rank=2, port=port))
    reporter.step(1)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'flywheel_train_steps_total{job="train",namespace="ml",rank="2",replica="1"} 1.0' in body
    other = ProgressReporter(env(tmp_path, rank=3, local_rank=1, port=port))  # would collide: does not serve
    assert other.metrics.port == 0


def test_outside_flywheel_it_is_a_no_op_and_imports_no_torch() -> None:
    code = ("import sys, os; os.environ.pop('FLYWHEEL_JOB', None); from flywheel import progress; "
            "progress.step(1, loss=1.0); assert progress._reporter is None; "
            "assert 'torch' not in sys.modules and 'kopf' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert progress.in_flywheel({"FLYWHEEL_JOB": "a/b"}) and not progress.in_flywheel({})
