"""Shared helpers for the local executor tests: the repo root, a hosted rendezvous store, process checks."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.rank_processes import alive

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
PYTHON = sys.executable


@pytest.fixture()
def rdzv_store():
    """A c10d TCPStore hosted by the test, as `flywheel run` hosts it; yields its 'host:port'."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    yield f"127.0.0.1:{store.port}"
    del store


def child_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.update(extra)
    return env


def write_job(path: Path, name: str, body: str) -> Path:
    path.write_text(f"apiVersion: flywheel.dev/v1alpha1\nkind: TrainingJob\nmetadata: {{name: {name}}}\nspec:\n{body}")
    return path


def processes_with_env(needle: str) -> list[int]:
    """Live pids whose environment contains `needle` (e.g. a run's FLYWHEEL_EVENTS_FILE=...): what a run left."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle.encode() in f.read() and alive(int(name)):
                    found.append(int(name))
        except OSError:
            continue
    return found
