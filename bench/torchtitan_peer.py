"""Flywheel beside TorchTitan on the same Llama: tokens/s, peak memory and start-up time, side by side.

- Peer: TorchTitan (PyPI, the `bench` extra) with its own training entry and loop, `torchtitan.train.main(Trainer)`,
  under `torchrun --standalone`, through the glue in bench/torchtitan_entry.py (our shape as a flavor of its llama3
  model, Flywheel's synthetic tokens in its data loader) and, on a machine without a GPU, bench/torchtitan_cpu.py
  (why TorchTitan does not run on a CPU as installed, and what the glue sets). Two runs of it: as it ships
  (checkpointing off, the headline's peer), and with its own asynchronous checkpointing (`--checkpoint.async_mode
  async`: dcp.async_save on a thread) every `CKPT_EVERY` steps keeping the 2 newest, as ours: what the same
  fault-tolerance cadence costs each trainer.
- Ours: `flywheel run` (local supervisor, `flywheel launch` agent, warm rank start, event log) with its fault
  tolerance on: async checkpoints every `CKPT_EVERY` steps, the progress watchdog, the stop-flag all-reduce.
- Same: the Llama shape (TorchTitan's `debugmodel` flavor, 6 x 256, 16 heads, ffn 768, vocab 2048; quick: 2 x 64;
  on a GPU Llama 3.2-1B's sizes with an untied head), sequence length, global batch (one micro batch per rank: no
  accumulation), precision (fp32 on a CPU; bf16 on a GPU: FSDP2's mixed precision over fp32 weights, autocast at
  world 1), layout (1 process without a sharding wrapper, and 2 processes FSDP2 over gloo on a CPU), AdamW
  hyperparameters (lr, betas 0.9/0.95, weight decay 0.1, eps 1e-8, clip 1.0), the same samples in the same order,
  one OMP thread per rank. Each keeps its own defaults otherwise (TorchTitan: fused AdamW, its GC control, logging
  every 10 steps; Flywheel: deterministic kernels, fused AdamW too, a step record every step), activation
  checkpointing and compile off on both.
- tokens/s: steady state, from the wall time between the end of step WARMUP and the end of the last step (every
  step's end: rank 0's `step` event for ours, after `train_step` for TorchTitan), so a checkpoint save costs ours
  what it costs; start-up: from the launcher's start (Popen) to the end of the first step; peak memory: the largest
  VmHWM (peak RSS) among the rank processes on a CPU, torch.cuda.max_memory_allocated on a GPU.
- Rounds alternate the order (A B C, C B A); each ratio is Flywheel / TorchTitan as it ships (>= 1 is better for
  tokens/s, <= 1 for memory and start-up), and the tokens/s ratio to TorchTitan checkpointing as often as ours; the
  headline is the median over rounds of the world-1 tokens/s ratio.

    python -m bench.torchtitan_peer [--quick] [--rounds N] [--world 1 --world 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.common import median, write_result
from bench.goodput_faults import find_ranks
from flywheel.eventlog import Start, Step, read_records

REPO = Path(__file__).resolve().parents[1]
CKPT_EVERY = 10
GOAL = 1.0


@dataclass(frozen=True)
class Config:
    layers: int
    dim: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    global_batch: int
    steps: int
    warmup: int  # steps left out of the steady state
    rope_theta: float = 500000.0
    seed: int = 0
    lr: float = 3e-4

    def shape(self) -> dict[str, Any]:
        return {"layers": self.layers, "dim": self.dim, "heads": self.heads, "kv_heads": self.kv_heads,
                "ffn": self.ffn, "vocab": self.vocab, "rope_theta": self.rope_theta, "seed": self.seed}


# TorchTitan's llama3 "debugmodel" flavor (its untied head, RoPE theta 500000 with Llama 3.1's scaling); quick: 2 x 64.
FULL = Config(layers=6, dim=256, heads=16, kv_heads=16, ffn=768, vocab=2048, seq_len=256, global_batch=8, steps=25,
              warmup=3)
# On a GPU: Llama 3.2-1B's sizes (16 x 2048, 32 heads, 8 kv, ffn 8192, vocab 128256) with TorchTitan's untied head,
# seqLen 2048, 4 samples per GPU, as bench/gpu_check.py measures Flywheel alone.
GPU = Config(layers=16, dim=2048, heads=32, kv_heads=8, ffn=8192, vocab=128256, seq_len=2048, global_batch=4,
             steps=30, warmup=5)
QUICK = Config(layers=2, dim=64, heads=4, kv_heads=2, ffn=128, vocab=256, seq_len=64, global_batch=8, steps=12,
               warmup=3)


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _threads(world: int) -> str:
    # One intra-op thread per rank on both sides: `flywheel run` gives its ranks one (local/supervisor.py sets
    # OMP_NUM_THREADS=1), and on this shared 2-core machine two threads made TorchTitan's steps erratic (llama 2 x 64:
    # 300-12,000 tokens/s from step to step with 2 threads, a steady ~15,000 with 1).
    return "1"


def flywheel_job(cfg: Config, world: int, workdir: Path, gpu: bool) -> dict[str, Any]:
    # Preset llama3-8b for what the sizes do not say: untied head, RoPE theta 500000 and Llama 3.1's scaling, as
    # TorchTitan's llama3 has them.
    model = {"preset": "llama3-8b", "layers": cfg.layers, "dim": cfg.dim, "heads": cfg.heads,
             "kvHeads": cfg.kv_heads, "ffn": cfg.ffn, "vocab": cfg.vocab, "seqLen": cfg.seq_len}
    training = {"steps": cfg.steps, "globalBatch": cfg.global_batch, "microBatch": cfg.global_batch // world,
                "lr": cfg.lr, "warmupSteps": 2, "seed": cfg.seed, "precision": "bf16" if gpu else "fp32"}
    return {"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "titan-peer"},
            "spec": {"replicas": {"min": 1, "max": 1}, "procsPerReplica": world,
                     # The default layout (fsdp: true): FSDP2 at two processes; at one no wrapper at all
                     # (layout/rules.py dp_wrapper), as TorchTitan at dp_shard 1.
                     "trainer": {"model": model, "training": training,
                                 "data": {"source": "synthetic"}},
                     "checkpoint": {"dir": str(workdir / "ckpt"), "everySteps": CKPT_EVERY, "keep": 2,
                                    "async": True},
                     "faultTolerance": {"progressTimeoutSeconds": 300, "firstStepTimeoutSeconds": 600}}}


def titan_args(cfg: Config, world: int, workdir: Path, gpu: bool, checkpoints: bool = False) -> list[str]:
    """TorchTitan's command line; `checkpoints`: its own async checkpointing at our cadence and retention (its last
    save, after the last step, is outside the measured window, as ours is)."""
    from bench.torchtitan_entry import FLAVOR, SPEC_NAME

    saves = ["--checkpoint.enable", "--checkpoint.interval", str(CKPT_EVERY), "--checkpoint.async_mode", "async",
             "--checkpoint.keep_latest_k", "2"] if checkpoints else []
    return ["--model.name", SPEC_NAME, "--model.flavor", FLAVOR, "--job.dump_folder", str(workdir / "dump"),
            "--training.steps", str(cfg.steps), "--training.seq_len", str(cfg.seq_len),
            "--training.local_batch_size", str(cfg.global_batch // world),
            "--training.global_batch_size", str(cfg.global_batch), "--training.dtype", "float32",
            "--training.mixed_precision_param", "bfloat16" if gpu else "float32",
            "--parallelism.data_parallel_shard_degree", str(world), "--activation_checkpoint.mode", "none",
            "--optimizer.lr", str(cfg.lr), "--lr_scheduler.warmup_steps", "2",
            "--comm.init_timeout_seconds", "600", *saves]


class PeakRss(threading.Thread):
    """Polls the rank processes below `root` and keeps each one's VmHWM (it only grows: the last reading before a
    process exits is at most one poll short)."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root, self.done = root, threading.Event()
        self.peaks: dict[int, int] = {}

    def run(self) -> None:
        while not self.done.wait(0.2):
            for pid in find_ranks([self.root]).values():
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                for line in status.splitlines():
                    if line.startswith("VmHWM:"):
                        self.peaks[pid] = max(self.peaks.get(pid, 0), int(line.split()[1]) * 1024)


def _launch(argv: list[str], env: dict[str, str], log: Path, timeout_s: float) -> tuple[float, dict[int, int]]:
    """Runs a launcher to its end; its start time and each rank's peak RSS."""
    with log.open("wb") as out:
        began = time.time()
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    poller = PeakRss(proc.pid)
    poller.start()
    try:
        code = proc.wait(timeout=timeout_s)
    finally:
        poller.done.set()
        if proc.poll() is None:
            from flywheel.local.procs import kill_tree

            kill_tree(proc.pid)
            proc.wait()
    if code:
        raise RuntimeError(f"{argv[:6]} exited {code}; see {log}")
    return began, poller.peaks


def steady(ends: list[float], began: float, cfg: Config) -> dict[str, Any]:
    """tokens/s between the end of step `warmup` and the last (wall time: checkpoint saves and load spikes count),
    and at the median time between step ends (neither counts); start-up to the end of the first step."""
    tokens = cfg.global_batch * cfg.seq_len
    window = ends[cfg.warmup - 1:]
    gaps = [b - a for a, b in zip(window, window[1:])]
    return {"tokens_per_s": tokens * len(gaps) / (window[-1] - window[0]),
            "median_step_tokens_per_s": tokens / median(gaps), "median_step_s": median(gaps),
            "startup_s": ends[0] - began, "steps": len(ends)}


def run_flywheel(cfg: Config, world: int, workdir: Path, gpu: bool) -> dict[str, Any]:
    workdir.mkdir(parents=True)
    (workdir / "job.yaml").write_text(yaml.safe_dump(flywheel_job(cfg, world, workdir, gpu)))
    out = workdir / "run"
    env = dict(os.environ, OMP_NUM_THREADS=_threads(world), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "flywheel.cli", "run", str(workdir / "job.yaml"), "--out", str(out),
            "--no-progress"]
    began, peaks = _launch(argv, env, workdir / "flywheel.log", 1800)
    records = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines() if line.strip()]
    typed = read_records(out / "events.jsonl")
    ends = [r.time for r in typed if isinstance(r, Step)]
    start = next(r for r in records if r.get("event") == "start" and r.get("source") != "agent")
    done: dict[str, Any] = next((r for r in records if r.get("event") == "done"), {})
    first_step = next(r.step_seconds for r in typed if isinstance(r, Step))
    result = steady(ends, began, cfg)
    result.update(peak_rss_bytes=max(peaks.values(), default=0), ranks_seen=len(peaks),
                  cuda_max_allocated_bytes=done.get("peak_memory_bytes") if gpu else None,
                  phases={**(start.get("startup_seconds") or {}), "first_step": first_step},
                  rank_start_to_first_step_s=ends[0] - start["time"] + sum((start.get("startup_seconds") or {})
                                                                           .values()),
                  starts=sum(isinstance(r, Start) for r in typed))
    return result


def run_titan(cfg: Config, world: int, workdir: Path, gpu: bool, checkpoints: bool = False) -> dict[str, Any]:
    from bench.torchtitan_entry import OUT_ENV, SHAPE_ENV

    workdir.mkdir(parents=True)
    env = dict(os.environ, OMP_NUM_THREADS=_threads(world), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    env.update({OUT_ENV: str(workdir / "titan.json"), SHAPE_ENV: json.dumps(cfg.shape())})
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
            "-m", "bench.torchtitan_entry", *titan_args(cfg, world, workdir, gpu, checkpoints)]
    began, peaks = _launch(argv, env, workdir / "torchtitan.log", 1800)
    rank0 = json.loads((workdir / "titan.json.rank0").read_text())
    result = steady(rank0["step_ends"], began, cfg)
    first_step = rank0["step_ends"][0] - rank0["init_ended"]
    result.update(peak_rss_bytes=max(peaks.values(), default=0), ranks_seen=len(peaks),
                  self_reported_max_rss_bytes=rank0["max_rss_bytes"],
                  cuda_max_allocated_bytes=rank0["cuda_max_allocated_bytes"], torchtitan=rank0["torchtitan"],
                  params=rank0.get("params"),
                  phases={"imports": rank0["imports_s"], "trainer_init": rank0["init_ended"] - rank0["init_began"],
                          "first_step": first_step},
                  rank_start_to_first_step_s=rank0["step_ends"][0] - rank0["began"],
                  checkpoint_steps=sorted(int(p.name.removeprefix("step-"))
                                          for p in (workdir / "dump" / "checkpoint").glob("step-*")))
    return result


def run_titan_checkpointing(cfg: Config, world: int, workdir: Path, gpu: bool) -> dict[str, Any]:
    return run_titan(cfg, world, workdir, gpu, checkpoints=True)


SIDES = {"flywheel": run_flywheel, "torchtitan": run_titan, "torchtitan_ckpt": run_titan_checkpointing}


def measure(cfg: Config, world: int, rounds: int, tmp: Path, gpu: bool) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for r in range(rounds):
        order = list(SIDES) if r % 2 == 0 else list(reversed(SIDES))
        for side in order:
            runs[side].append(SIDES[side](cfg, world, tmp / f"w{world}-{side}-{r}", gpu))
            print(f"world {world} round {r} {side}: {runs[side][-1]['tokens_per_s']:.0f} tokens/s, start-up "
                  f"{runs[side][-1]['startup_s']:.1f} s", flush=True)
    memory_key = "cuda_max_allocated_bytes" if gpu else "peak_rss_bytes"

    def ratios(key: str, peer: str = "torchtitan") -> list[float]:
        return [f[key] / t[key] for f, t in zip(runs["flywheel"], runs[peer]) if f[key] and t[key]]

    return {"world": world, "layout": "1 process" if world == 1 else f"{world} processes, FSDP2",
            "tokens_per_s_ratio": median(ratios("tokens_per_s")),
            "median_step_tokens_per_s_ratio": median(ratios("median_step_tokens_per_s")),
            "memory_ratio": median(ratios(memory_key)),
            "startup_ratio": median(ratios("startup_s")), "memory_metric": memory_key,
            "round_tokens_per_s_ratios": ratios("tokens_per_s"),
            "checkpointing_peer_tokens_per_s_ratio": median(ratios("tokens_per_s", "torchtitan_ckpt")),
            **{f"{side}_{key}": median([x[key] for x in runs[side]])
               for side in SIDES for key in ("tokens_per_s", "median_step_tokens_per_s", "startup_s", memory_key)},
            "runs": runs}


def _gib(x: float | None) -> str:
    return f"{x / 2**30:.2f}" if x else "-"


def report(cfg: Config, rows: list[dict[str, Any]]) -> None:
    print(f"\nLlama {cfg.layers} x {cfg.dim}, {cfg.heads} heads ({cfg.kv_heads} kv), ffn {cfg.ffn}, vocab {cfg.vocab}; "
          f"seqLen {cfg.seq_len}, global batch {cfg.global_batch}, {cfg.steps} steps (steady state after "
          f"{cfg.warmup}); Flywheel checkpoints every {CKPT_EVERY} steps")
    print(f"{'layout':<22}{'side':<16}{'tokens/s':>10}{'(median)':>10}{'start-up s':>12}{'peak GiB':>10}   "
          "phases to the first step (s), last round")
    for row in rows:
        key = row["memory_metric"]
        for side in SIDES:
            last = row["runs"][side][-1]
            phases = " ".join(f"{k} {v:.2f}" for k, v in last["phases"].items())
            print(f"{row['layout']:<22}{side:<16}{row[f'{side}_tokens_per_s']:>10.0f}"
                  f"{row[f'{side}_median_step_tokens_per_s']:>10.0f}{row[f'{side}_startup_s']:>12.1f}"
                  f"{_gib(row[f'{side}_{key}']):>10}   {phases}")
        print(f"{'':<22}{'ratio':<16}{row['tokens_per_s_ratio']:>10.3f}{row['median_step_tokens_per_s_ratio']:>10.3f}"
              f"{row['startup_ratio']:>12.3f}"
              f"{row['memory_ratio']:>10.3f}   per round: "
              + " ".join(f"{x:.3f}" for x in row["round_tokens_per_s_ratios"]))
        print(f"{'':<22}{'ratio (ckpt)':<16}{row['checkpointing_peer_tokens_per_s_ratio']:>10.3f}   "
              f"to TorchTitan checkpointing every {CKPT_EVERY} steps too")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the 2 x 64 model, 12 steps, 1 round, world 1")
    parser.add_argument("--rounds", type=int, help="A/B rounds per layout (default 3, quick 1)")
    parser.add_argument("--world", type=int, action="append", choices=(1, 2),
                        help="processes (repeatable; default 1 and 2 on a CPU, 1 on a GPU; quick 1)")
    args = parser.parse_args(argv)
    try:
        import torchtitan  # noqa: F401
    except ImportError:  # `make bench-quick` on a `dev` install: nothing to compare with, not a failure
        print("skipped: torchtitan is not installed (pip install -c constraints.txt -e '.[bench]')")
        return 0
    gpu = on_gpu()
    cfg = QUICK if args.quick else GPU if gpu else FULL
    worlds = args.world or ([1] if args.quick or gpu else [1, 2])
    rounds = args.rounds or (1 if args.quick else 3)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fw-titan-") as tmp:
        rows = [measure(cfg, world, rounds, Path(tmp), gpu) for world in worlds]
    report(cfg, rows)
    print(f"{time.monotonic() - began:.0f} s")
    head = rows[0]
    version = head["runs"]["torchtitan"][0]["torchtitan"]
    device = "GPU (bf16)" if gpu else "CPU (fp32; TorchTitan through bench/torchtitan_cpu.py)"
    write_result("torchtitan_peer", metric=f"tokens/s, {head['layout']}, {device}",
                 value=head["flywheel_tokens_per_s"], unit="tokens/s",
                 peer=f"TorchTitan {version} (torchtitan.train, its llama3), same shape/batch/precision/layout",
                 peer_value=head["torchtitan_tokens_per_s"], ratio=head["tokens_per_s_ratio"],
                 goal=f"Flywheel / TorchTitan tokens/s >= {GOAL} with checkpoints every {CKPT_EVERY} steps",
                 passed=all(row["tokens_per_s_ratio"] >= GOAL for row in rows), runs=rows, quick=args.quick,
                 config={**cfg.shape(), "seq_len": cfg.seq_len, "global_batch": cfg.global_batch, "steps": cfg.steps,
                         "warmup": cfg.warmup, "precision": "bf16" if gpu else "fp32"},
                 torchtitan_on_cpu=None if gpu else CPU_NOTE)
    return 0


# What the result says about TorchTitan on a CPU (bench/torchtitan_cpu.py has the detail).
CPU_NOTE = ("TorchTitan 0.2.2 does not run on a CPU as installed: torchtitan/tools/utils.py get_device_info() falls "
            "back to device type 'cuda' without an accelerator, and Trainer.__init__ (train.py:90) fails in "
            "torch.cuda.set_device ('Found no NVIDIA driver on your system'); its DeviceMemoryMonitor needs "
            "memory_stats etc. that torch.cpu lacks; under FSDP on gloo its gradient divide factor of 1 makes FSDP2 "
            "reduce with PREMUL_SUM, which gloo lacks. Our glue sets the device type to cpu with a CPU device "
            "module and turns on FSDP2's set_force_sum_reduction_for_comms; TorchTitan's trainer, loop and model "
            "run unchanged.")


if __name__ == "__main__":
    sys.exit(main())
