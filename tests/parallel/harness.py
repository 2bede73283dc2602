"""Runs `layout_worker` on N local gloo ranks and reads back what rank 0 wrote."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import torch

from tests.warm_ranks import start_rank

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_layout(world: int, workdir: Path, *, parallelism: dict[str, Any] | None = None, steps: int = 6,
               lr: float = 0.5, timeout: float = 240, **options: Any) -> dict[str, Any]:
    """Trains gpt-tiny for `steps` SGD steps on `world` ranks; returns {"losses": {step: loss}, "params": {...}}."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "result.json"
    run = {"parallelism": parallelism or {}, "steps": steps, "lr": lr, "globalBatch": 8, "microBatch": 2,
           "out": str(out), **options}
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), LAYOUT_RUN=json.dumps(run))
        with open(workdir / f"rank{rank}.log", "ab") as log:
            procs.append(start_rank("tests.parallel.layout_worker", env, log))
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if codes != [0] * world:
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(workdir.glob("rank*.log")))
        raise AssertionError(f"exit codes {codes}\n{logs}")
    result = json.loads(out.read_text())
    result["losses"] = {int(k): v for k, v in result["losses"].items()}
    result["aux_losses"] = {int(k): v for k, v in result["aux_losses"].items()}
    result["eval_losses"] = {int(k): v for k, v in result.get("eval_losses", {}).items()}
    result["params"] = torch.load(str(out) + ".pt")
    return result


def max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest |a - b| / max|b| over the parameters (the same keys in both)."""
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)) for k in a)


def loss_relative_difference(a: dict[int, float], b: dict[int, float]) -> float:
    assert sorted(a) == sorted(b)
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in a)
