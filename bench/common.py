"""Shared helpers for benchmarks: the result record and where it goes."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

from flywheel.local.procs import kill_tree

# Smoke runs in the test suite point this elsewhere so they never overwrite the committed results.
RESULTS = Path(os.environ.get("FLYWHEEL_BENCH_RESULTS", Path(__file__).resolve().parent / "results"))


class DataPosition:
    """The data loader's checkpointed position, for benchmarks that checkpoint an AppState without a loader."""

    consumed_samples = 0

    def state_dict(self) -> dict[str, Any]:
        return {"consumed_samples": self.consumed_samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.consumed_samples = state["consumed_samples"]


def machine() -> str:
    try:
        import torch

        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except ImportError:
        device = "cpu"
    return f"{platform.node()} {os.cpu_count()} cpus {device}"


def write_result(name: str, *, metric: str, value: float | None, unit: str, peer: str, peer_value: float | None,
                 goal: str, passed: bool, runs: Any, path: Path | None = None, ratio: float | None = None,
                 **extra: Any) -> Path:
    """Write bench/results/<name>.json (or `path`) with the fields every benchmark reports; ratio = ours / peer
    unless the benchmark computes it otherwise (e.g. paired per round) and passes it."""
    if ratio is None:  # None when a side never finished (e.g. an unrecovered trial)
        ratio = value / peer_value if value is not None and peer_value else None
    record = {"metric": metric, "value": value, "unit": unit, "peer": peer, "peer_value": peer_value,
              "ratio": ratio, "goal": goal, "pass": bool(passed),
              "runs": runs, "machine": machine(), **extra}
    if os.environ.get("FLYWHEEL_BENCH_LANES"):  # run beside the other lane of `python -m bench --quick`
        record["concurrent_lanes"] = True
    path = path or RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path


def run_session(argv: list[str], env: dict[str, str], cwd: Path, timeout_s: float) -> int | None:
    """Run a launcher in its own session, output discarded; its exit code, or None when it outlived `timeout_s`
    and was killed with everything it started (ranks, some perhaps SIGSTOPped, included)."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # The whole tree, not just the session: torch elastic starts each worker in a session of its own, so a
        # timed-out torchrun's ranks would outlive a killpg (found as orphans of censored trials, still running).
        kill_tree(proc.pid)
        proc.wait()
        return None


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]
