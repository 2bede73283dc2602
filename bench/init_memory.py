"""Peak host memory per rank of building and sharding the model: meta-device init (build on the meta device, FSDP2
`fully_shard`, then materialise this rank's shards: what the trainer does) against the plain build (every rank
builds the whole model on CPU, then shards it: what it did before). gpt-1.3b, FSDP over 4 gloo ranks. Goal: the
meta path's peak RSS at most 1 / world + 5% of the plain one's (30% here): this rank's quarter of the parameters,
plus one block of rows drawn while replaying the init, plus the process's own baseline.

Measured: ru_maxrss of each rank after build + parallelize (no training step: a gpt-1.3b step with its optimizer
state does not fit four ranks in this machine's memory, and the step's memory is the same on both paths). The plain
path's ranks build one after the other (a barrier between them), so four full copies never coexist here; each rank's
own peak is what it would be alone. The baseline is each rank's RSS before it builds (torch and gloo loaded).

    python -m bench.init_memory [--quick]     # --quick: gpt-125m on 2 ranks
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import median, write_result
from flywheel.trainer.ft.process_exit import exit_rank

REPO = Path(__file__).resolve().parents[1]
SLACK = 0.05  # over 1 / world: the largest tensor drawn in full, the baseline


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def rank_main(preset: str, mode: str, out: str) -> None:
    """One rank: build (meta or plain CPU) and parallelize with FSDP2; writes its peak RSS (MiB) to `out`."""
    import torch
    import torch.distributed as dist

    from flywheel.spec.job import ModelSpec, Parallelism, Training
    from flywheel.trainer.distributed.parallelize import build_mesh, parallelize
    from flywheel.trainer.models.materialize import META
    from flywheel.trainer.models.registry import build_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ModelSpec(preset=preset).shape()
    parallelism = Parallelism(fsdp=True)
    training = Training(steps=1, global_batch=world, micro_batch=1)
    mesh = build_mesh(world, parallelism)
    baseline = _rss_mib()
    for turn in range(world):  # the plain path one rank at a time (see the module doc); the meta path alike
        if turn == rank:
            model = build_model(cfg, seed=0, device=META if mode == "meta" else None)
            model = parallelize(model, mesh, parallelism, training)  # type: ignore[assignment]
        dist.barrier()
    local = sum(p.to_local().numel() for p in model.parameters()) * 4 / 2**20  # type: ignore[attr-defined]
    Path(out).write_text(json.dumps({"peak_mib": _rss_mib(), "baseline_mib": baseline, "params_mib": local}))
    dist.destroy_process_group()


def measure(preset: str, world: int, mode: str, workdir: Path) -> list[dict[str, float]]:
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        argv = [sys.executable, "-m", "bench.init_memory", "--rank", preset, mode, str(workdir / f"{mode}{rank}")]
        procs.append(subprocess.Popen(argv, cwd=REPO, env=env))
    codes = [p.wait(timeout=1800) for p in procs]
    if codes != [0] * world:
        raise SystemExit(f"{mode}: rank exit codes {codes}")
    return [json.loads((workdir / f"{mode}{rank}").read_text()) for rank in range(world)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--rank", nargs=3, metavar=("PRESET", "MODE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(*args.rank)
        exit_rank(0)
    preset, world = ("gpt-125m", 2) if args.quick else ("gpt-1.3b", 4)
    with tempfile.TemporaryDirectory() as tmp:
        runs = {mode: measure(preset, world, mode, Path(tmp)) for mode in ("plain", "meta")}
    peak = {mode: max(r["peak_mib"] for r in ranks) for mode, ranks in runs.items()}
    baseline = median([r["baseline_mib"] for ranks in runs.values() for r in ranks])
    ratio, goal = peak["meta"] / peak["plain"], 1 / world + SLACK
    print(f"{preset}, world {world}: peak RSS per rank {peak['plain']:.0f} MiB plain -> {peak['meta']:.0f} MiB "
          f"meta ({ratio:.2f}); baseline {baseline:.0f} MiB, "
          f"{runs['meta'][0]['params_mib']:.0f} MiB of parameters per rank")
    write_result("init_memory", metric=f"peak host RSS per rank, {preset} FSDP world {world}, build + parallelize",
                 value=round(peak["meta"]), unit="MiB", peer="plain CPU build then shard (before)",
                 peer_value=round(peak["plain"]), goal=f"meta / plain <= {goal:.2f} (1 / world + {SLACK})",
                 passed=ratio <= goal, runs=runs, path=args.out, ratio=ratio, baseline_mib=round(baseline),
                 quick=args.quick)


if __name__ == "__main__":
    main()
