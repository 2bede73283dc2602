"""Smoke runs of bench/compile_graph_breaks.py and bench/loss_memory.py: each writes its result with every field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *argv: str) -> dict:
    env = dict(os.environ, FLYWHEEL_BENCH_RESULTS=str(tmp_path), PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "-m", *argv], cwd=REPO, env=env, check=True, timeout=900)
    [result] = tmp_path.glob("*.json")
    return json.loads(result.read_text())


def test_graph_breaks_are_counted_per_preset(tmp_path):
    record = _run(tmp_path, "bench.compile_graph_breaks", "--preset", "llama-tiny")
    [row] = record["runs"]
    assert row["preset"] == "llama-tiny" and row["graph_breaks"] == 0 and row["graphs"] >= 1
    assert record["value"] == 0 and record["pass"]


def test_loss_memory_compares_the_full_and_chunked_loss(tmp_path):
    record = _run(tmp_path, "bench.loss_memory", "--tokens", "64")
    assert record["runs"]["full"]["peak_bytes"] > 0 and record["runs"]["chunked"]["peak_bytes"] >= 0
    assert abs(record["runs"]["full"]["loss"] - record["runs"]["chunked"]["loss"]) < 1e-3
