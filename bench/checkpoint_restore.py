"""How long does a restore take from memory (own copy, peer's replica) against from disk?

Two gloo ranks, each playing one worker with its own host memory (a folder per rank under the memory root), hold
a stack of Linear layers with AdamW state (~0.55 GB of model + optimizer state per rank; `--quick`: ~50 MB). Both
tiers save the same step, then each restore runs `--reps` times into a fresh state (Checkpointer.restore, the
slowest rank's time; the median is reported):
  disk         the memory tier off: the committed DCP checkpoint, checksums verified, loaded;
  memory-own   every rank's own copy in /dev/shm (a rank restarted in place);
  memory-peer  worker 1's memory wiped first (a lost node): rank 1's copy comes from rank 0's replica over gloo.
The disk checkpoint was just written, so its reads come from the page cache: the comparison favours disk.

    .venv/bin/python -m bench.checkpoint_restore [--quick] [--reps N] [--out bench/results/checkpoint_restore.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from bench.common import RESULTS, DataPosition, write_result
from flywheel.spec import CheckpointSpec
from flywheel.trainer.checkpoint import AppState, Checkpointer
from flywheel.trainer.checkpoint_memory_root import SHM

GOAL = 0.2
WORLD = 2


def _app(dim: int, layers: int, rank: int, seed: int) -> AppState:
    torch.manual_seed(seed)
    model = nn.Sequential(*(nn.Linear(dim, dim) for _ in range(layers)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(4, dim)).square().mean().backward()
    optimizer.step()  # AdamW state exists, as after any step
    optimizer.zero_grad(set_to_none=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    return AppState(model, optimizer, scheduler, DataPosition(), rank=rank, world_size=WORLD)


def _timed_restore(ckpt: Checkpointer, app: AppState) -> tuple[float, int | None]:
    dist.barrier()
    t0 = time.perf_counter()
    step = ckpt.restore(app)
    seconds = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the restore is done when the slowest rank is
    return float(seconds.item()), step


def _rank_main(rank: int, root: str, mem_base: str, dim: int, layers: int, reps: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/pg-init", rank=rank, world_size=WORLD)
    try:
        host = Path(mem_base) / f"worker-{rank}"
        cfg = CheckpointSpec(dir=f"{root}/ckpt", every_steps=1, memory_every_steps=1, keep=1)
        app = _app(dim, layers, rank, seed=0)
        ckpt = Checkpointer(cfg, cfg.dir, memory_dir=host)
        ckpt.save(1, app)  # disk and memory, both in the background
        ckpt.close()
        state_bytes = sum(t.numel() * t.element_size() for t in app.model.state_dict().values()) * 3
        runs: dict[str, list[float]] = {"disk": [], "memory-own": [], "memory-peer": []}
        for _ in range(reps):
            for source in runs:
                if source == "memory-peer" and rank == 1:
                    shutil.rmtree(host, ignore_errors=True)  # worker 1's node is gone, and its memory with it
                dist.barrier()
                fresh = _app(dim, layers, rank, seed=1)
                ckpt = Checkpointer(cfg, cfg.dir, memory_dir=None if source == "disk" else host)
                seconds, step = _timed_restore(ckpt, fresh)
                ckpt.close()
                assert step == 1, f"{source}: restored step {step}"
                runs[source].append(seconds)
        if rank == 0:
            Path(root, "runs.json").write_text(json.dumps({"runs": runs, "state_bytes": state_bytes}))
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="~50 MB of state per rank instead of ~0.55 GB")
    parser.add_argument("--reps", type=int, default=None, help="measured restores per source (default 5, quick 2)")
    parser.add_argument("--out", type=Path, default=RESULTS / "checkpoint_restore.json")
    args = parser.parse_args()
    reps = args.reps or (2 if args.quick else 5)
    dim, layers = (1024, 4) if args.quick else (2048, 11)
    root = Path(tempfile.mkdtemp(prefix="ckpt-restore-"))
    mem_base = Path(tempfile.mkdtemp(prefix="flywheel-bench-restore-", dir=SHM if SHM.is_dir() else None))
    try:
        mp.spawn(_rank_main, args=(str(root), str(mem_base), dim, layers, reps), nprocs=WORLD, join=True)
        result = json.loads((root / "runs.json").read_text())
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(mem_base, ignore_errors=True)
    runs: dict[str, list[float]] = result["runs"]
    median = {name: statistics.median(values) for name, values in runs.items()}
    disk, own, peer = median["disk"], median["memory-own"], median["memory-peer"]
    print(f"state {result['state_bytes'] / 1e9:.3f} GB per rank (model + AdamW), {WORLD} gloo ranks, {reps} reps, "
          "median restore seconds (slowest rank):")
    print(f"{'source':<14}{'median s':>10}{'vs disk':>10}   runs")
    for name, values in runs.items():
        print(f"{name:<14}{median[name]:>10.4f}{median[name] / disk:>10.3f}   " + " ".join(f"{v:.4f}" for v in values))
    worst = max(own, peer)
    passed = worst <= GOAL * disk
    print(f"memory (worse of own/peer) / disk = {worst / disk:.3f} (goal <= {GOAL}): {'PASS' if passed else 'FAIL'}")
    write_result("checkpoint_restore", metric="restore seconds from memory (worse of own copy and peer replica)",
                 value=worst, unit="s", peer="restore from the committed disk checkpoint", peer_value=disk,
                 goal=f"<= {GOAL}x the disk restore", passed=passed, runs=runs, path=args.out,
                 own_seconds=own, peer_seconds=peer, own_ratio=own / disk, peer_ratio=peer / disk,
                 state_bytes_per_rank=result["state_bytes"], reps=reps)


if __name__ == "__main__":
    main()
