"""How long does a restore take from memory (own copy, peer's replica) against from disk, warm and cold?

Two gloo ranks, each playing one worker with its own host memory (a folder per rank under this host's /dev/shm), hold
a stack of Linear layers with AdamW state (~0.55 GB of model + optimizer state per rank; `--quick`: ~50 MB). Both
tiers save the same step, then each restore runs `--reps` times into a fresh state (Checkpointer.restore, the
slowest rank's time; the median is reported):
  disk (warm)              the memory tier off: the committed DCP checkpoint, checksums verified, loaded; its files
                           are in the page cache (just written, or read by the previous restore);
  disk (cold)              the same after every checkpoint file is evicted from the page cache (fsync, then
                           POSIX_FADV_DONTNEED): what a replacement node reads after a node loss, as it never had
                           the checkpoint in its page cache;
  memory-own               every rank's own copy in /dev/shm (a rank restarted in place);
  memory-peer (gloo)       worker 1's memory wiped first (a lost node): rank 0, holding rank 1's replica, sends it
                           over gloo, straight into rank 1's tensors, in pieces taken round the checkpointer's three
                           gloo groups (three sockets): the path a node loss on a cluster takes;
  memory-peer (same host)  the same loss, but rank 1 reads the replica's file itself: it is visible because both
                           workers share this host's /dev/shm (as under `flywheel run`; pods never do).
Beside them, the transport's floor: the same bytes (every tensor of the state, one message each) sent from rank 0's
memory to rank 1's preallocated tensors with plain gloo send/recv over one group and nothing else. memory-peer
(gloo) against it is the restore's own overhead, less what the three sockets gain; the floor against the disk
restore says what one stream of this host's loopback TCP allows.

Goal: the worse of memory-own and memory-peer (gloo) <= 0.2x the warm disk restore. Every memory source's ratio to
both the warm and the cold disk restore is a row of its own (the report's table): after a node loss the fair
comparison is the cold one, and the goal would be stated against it if only that one were met.

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
from flywheel.contracts.memory_root import SHM
from flywheel.spec.job import CheckpointSpec
from flywheel.trainer.checkpoint.manager import AppState, Checkpointer
from flywheel.trainer.ft.process_exit import exit_rank

GOAL = 0.2
WORLD = 2
DISK_WARM, DISK_COLD = "disk (warm)", "disk (cold)"
OWN, PEER_GLOO, PEER_HOST = "memory-own", "memory-peer (gloo)", "memory-peer (same host)"
SOURCES = (DISK_WARM, DISK_COLD, OWN, PEER_GLOO, PEER_HOST)
GLOO_FLOOR = "gloo send/recv of the same bytes"


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


def drop_page_cache(folder: Path) -> None:
    """Evict every file under `folder` from the page cache (written back first: dirty pages are not dropped)."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _prepare(source: str, rank: int, host: Path, backup: Path, ckpt_dir: Path) -> None:
    """Set up what each source restores from, on this rank, before the timed restore."""
    if source == DISK_COLD and rank == 0:
        drop_page_cache(ckpt_dir)
    if source == OWN and rank == 1 and not host.exists():  # a peer source wiped it: worker 1's copies come back
        shutil.copytree(backup, host)
    if source in (PEER_GLOO, PEER_HOST) and rank == 1:
        shutil.rmtree(host, ignore_errors=True)  # worker 1's node is gone, and its memory with it


def _rank_main(rank: int, root: str, mem_base: str, dim: int, layers: int, reps: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/pg-init", rank=rank, world_size=WORLD)
    try:
        host, backup = Path(mem_base) / f"worker-{rank}", Path(mem_base) / f"backup-{rank}"
        cfg = CheckpointSpec(dir=f"{root}/ckpt", every_steps=1, memory_every_steps=1, keep=1)
        app = _app(dim, layers, rank, seed=0)
        ckpt = Checkpointer(cfg, cfg.dir, memory_dir=host)
        ckpt.save(1, app)  # disk and memory, both in the background
        ckpt.close()
        shutil.copytree(host, backup)
        state_bytes = sum(t.numel() * t.element_size() for t in app.model.state_dict().values()) * 3
        runs: dict[str, list[float]] = {name: [] for name in SOURCES}
        for _ in range(reps):
            for source in SOURCES:
                _prepare(source, rank, host, backup, Path(cfg.dir))
                dist.barrier()
                fresh = _app(dim, layers, rank, seed=1)
                ckpt = Checkpointer(cfg, cfg.dir, memory_dir=None if source in (DISK_WARM, DISK_COLD) else host)
                if ckpt.memory is not None:
                    ckpt.memory.same_host_reads = source != PEER_GLOO
                seconds, step = _timed_restore(ckpt, fresh)
                ckpt.close()
                assert step == 1, f"{source}: restored step {step}"
                runs[source].append(seconds)
            runs.setdefault(GLOO_FLOOR, []).append(_gloo_floor(app, rank))
        if rank == 0:
            Path(root, "runs.json").write_text(json.dumps({"runs": runs, "state_bytes": state_bytes}))
    finally:
        dist.destroy_process_group()
    exit_rank(0)  # a failure above still reaches mp.spawn through its error file


def _gloo_floor(app: AppState, rank: int) -> float:
    """Seconds to move every tensor of the state from rank 0 to rank 1 with gloo alone (rank 1's clock)."""
    tensors = [t for t in app.model.state_dict().values()]
    tensors += [v for s in app.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    targets = [torch.empty_like(t) for t in tensors] if rank == 1 else tensors
    for t in targets:
        t.zero_()  # pages faulted in before the clock: the restore's targets are live tensors too
    dist.barrier()
    began = time.perf_counter()
    works = [dist.isend(t, dst=1) if rank == 0 else dist.irecv(t, src=0) for t in targets]
    for work in works:
        work.wait()
    seconds = time.perf_counter() - began
    flag = torch.tensor([seconds])
    dist.broadcast(flag, src=1)
    return float(flag.item())


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
    _report(result["runs"], result["state_bytes"], reps, args.quick, args.out)


def _report(runs: dict[str, list[float]], state_bytes: int, reps: int, quick: bool, out: Path) -> None:
    median = {name: statistics.median(values) for name, values in runs.items()}
    warm, cold = median[DISK_WARM], median[DISK_COLD]
    print(f"state {state_bytes / 1e9:.3f} GB per rank (model + AdamW), {WORLD} gloo ranks, {reps} reps, "
          "median restore seconds (slowest rank):")
    print(f"{'source':<26}{'median s':>10}{'vs warm':>10}{'vs cold':>10}   runs")
    for name, values in runs.items():
        print(f"{name:<26}{median[name]:>10.4f}{median[name] / warm:>10.3f}{median[name] / cold:>10.3f}   "
              + " ".join(f"{v:.4f}" for v in values))
    worst = max(median[OWN], median[PEER_GLOO])
    passed = worst <= GOAL * warm
    print(f"memory (worse of own copy / peer replica over gloo) = {worst / warm:.3f}x the warm disk restore "
          f"(goal <= {GOAL}x), {worst / cold:.3f}x the cold one: {'PASS' if passed else 'FAIL'}")
    rows = [{"name": f"{name} vs {disk}", "metric": f"restore seconds, {name}", "value": median[name],
             "unit": "s", "peer": f"restore from the committed checkpoint, {disk}", "peer_value": median[disk],
             "ratio": median[name] / median[disk], "goal": f"<= {GOAL}x", "pass": median[name] <= GOAL * median[disk]}
            for name in (OWN, PEER_GLOO, PEER_HOST) for disk in (DISK_COLD, DISK_WARM)]
    if GLOO_FLOOR in median:
        floor = median[GLOO_FLOOR]
        print(f"{GLOO_FLOOR}: {floor:.4f} s ({floor / cold:.3f}x the cold disk restore); the peer restore over gloo "
              f"takes {median[PEER_GLOO] / floor:.2f}x that")
        rows.append({"name": f"{PEER_GLOO} vs the transport alone", "metric": f"restore seconds, {PEER_GLOO}",
                     "value": median[PEER_GLOO], "unit": "s", "peer": GLOO_FLOOR, "peer_value": floor,
                     "ratio": median[PEER_GLOO] / floor, "goal": "(the restore's overhead over its transport)",
                     "pass": None})
    write_result("checkpoint_restore", metric="restore seconds from memory (worse of own copy and peer replica "
                 "over gloo)", value=worst, unit="s",
                 peer=f"restore from the committed disk checkpoint, warm (page-cached; cold: {cold:.3f} s, "
                 f"{worst / cold:.2f}x)", peer_value=warm,
                 goal=f"<= {GOAL}x the warm disk restore", passed=passed, runs=runs, path=out, rows=rows,
                 quick=quick, warm_disk_seconds=warm, cold_disk_seconds=cold,
                 seconds={name: median[name] for name in median},
                 ratio_to_warm_disk={name: median[name] / warm for name in SOURCES},
                 ratio_to_cold_disk={name: median[name] / cold for name in SOURCES},
                 state_bytes_per_rank=state_bytes, reps=reps)


if __name__ == "__main__":
    main()
