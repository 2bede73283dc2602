"""A 60-step `flywheel run` whose checkpoints live on a small filesystem that fills up mid-run and is freed again:
no partial step folder is ever left, the cause is reported once in words (the run's output, the summary), and saves
commit again once there is space. Needs a tmpfs mount (root); skipped where mounting is not permitted."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JOB = """apiVersion: flywheel.dev/v1alpha1
kind: TrainingJob
metadata: {{name: diskfull}}
spec:
  replicas: {{min: 2, max: 2}}
  procsPerReplica: 1
  trainer:
    model: {{preset: null, layers: 4, dim: 128, heads: 4, vocab: 256, seqLen: 128}}
    parallelism: {{fsdp: false}}
    training: {{steps: 60, globalBatch: 16, microBatch: 4, warmupSteps: 1}}
  checkpoint: {{dir: {ckpt}, everySteps: 3, keep: 1}}
"""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "ckpt"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], capture_output=True,
                            text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """A file taking every free byte of the disk (unbuffered: a buffered close would raise ENOSPC itself)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as err:
                assert err.errno == errno.ENOSPC
    return filler


def events(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def test_a_full_disk_fails_saves_cleanly_and_they_commit_again_once_space_is_freed(tmp_path: Path,
                                                                                   small_disk: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB.format(ckpt=small_disk))
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "flywheel.cli", "run", str(job), "--out", str(out),
                             "--no-progress"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    filler: Path | None = None
    freed_after = 0
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        log = events(out / "events.jsonl")
        committed = [e for e in log if e["event"] == "checkpoint"]
        failed = [e for e in log if e["event"] == "checkpoint_failed"]
        if filler is None and committed:
            filler = fill(small_disk)
        elif filler is not None and filler.exists() and len(failed) >= 2:
            filler.unlink()
            freed_after = len(committed)
        time.sleep(0.05)
    output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, output
    log = events(out / "events.jsonl")
    failed = [e for e in log if e["event"] == "checkpoint_failed"]
    committed = [e["step"] for e in log if e["event"] == "checkpoint"]
    assert filler is not None and len(failed) >= 2, (committed, failed)
    assert {e["reason"] for e in failed} == {"no_space"}
    assert all(str(small_disk) in str(e["message"]) for e in failed)
    assert len(committed) > freed_after >= 1, committed  # saves commit again once the filler is gone
    # No partial folder left: only committed step folders remain (keep: 1, the newest).
    steps = sorted(p.name for p in small_disk.iterdir() if p.name.startswith("step-"))
    assert steps == [f"step-{committed[-1]:08d}"], steps
    # The cause, in words, once in the run's output as it happened, and once in the summary with its count.
    flat = " ".join(output.split())
    assert flat.count("failed: no space left on") == 2, output
    assert "training continues; newest good checkpoint: step" in flat and f"({len(failed)} saves)" in flat, output
    summary = json.loads((out / "summary.json").read_text())
    [report] = summary["checkpoint_failure_reports"]
    assert report["reason"] == "no_space" and report["count"] == len(failed)
