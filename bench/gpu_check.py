"""The trainer on a real GPU (`python -m bench.gpu_check`, a CUDA machine; CI has none, so nothing else runs it).

One short script for a lent GPU: what the card does at best (a bf16 matrix product), then the product path
(`flywheel run`, NCCL beside gloo, FSDP2 bf16 mixed precision) on Llama 3.2-1B, eager, with `compile: true`, with
`deterministic: true` (what exactness costs) and with `chunkedLoss: true`,
reporting tokens/s and MFU (model FLOPs per token from spec_model, over the datasheet's dense bf16 peak and over
the measured product); then exact resume on the GPU: a GPT-125M run killed mid-way must end with the parameter hash
of an unkilled run, with its async checkpoints' loop blocking on pinned staging buffers, and again with the memory
tier on (`memoryEverySteps`; the restore's source is reported) and for llama-tiny in bf16. Writes
bench/results/gpu_check.json (or --out), the device named in it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import yaml

from flywheel.eventlog import fold
from flywheel.eventlog.records import Checkpoint, Done, Restore, Step
from flywheel.eventlog.tail import read_records
from flywheel.planner.devices import DEVICES
from flywheel.spec import parse_spec

ROOT = Path(__file__).resolve().parent.parent
WARMUP_STEPS = 5  # steps left out of the medians: allocator warm-up, compilation, the first checkpoint


def job(name: str, model: dict[str, Any], training: dict[str, Any], every: int, steps: int,
        memory_every: int = 0) -> dict[str, Any]:
    memory = {"memoryEverySteps": memory_every} if memory_every else {}
    return {"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
            "spec": {"replicas": {"min": 1, "max": 1}, "procsPerReplica": 1,
                     "trainer": {"model": model, "parallelism": {"fsdp": True},
                                 "training": {"steps": steps, "warmupSteps": 2, "lr": 3e-4, **training},
                                 "data": {"source": "synthetic"}},
                     "checkpoint": {"dir": "ckpt", "everySteps": every, "keep": 2, "async": True, **memory},
                     "faultTolerance": {"maxRestarts": 3, "progressTimeoutSeconds": 300,
                                        "firstStepTimeoutSeconds": 900}}}


# "run": `flywheel run` (the product path); "rank": the trainer's rank entry alone with the worker contract's env
# (no agent), restarted by this script after a kill. The second is the fallback when the first cannot start.
MODE = {"launch": "run"}


def run_job(manifest: dict[str, Any], work: Path, kill_step: int | None, timeout_s: float) -> dict[str, Any]:
    """One job in its own directory: the step/checkpoint/done records and how it ended."""
    work.mkdir(parents=True, exist_ok=True)
    manifest = json.loads(json.dumps(manifest))
    manifest["spec"]["checkpoint"]["dir"] = str(work / "ckpt")
    began = time.monotonic()
    with open(work / "output.log", "w") as log:
        runner = _flywheel_run if MODE["launch"] == "run" else _rank_entry
        code = runner(manifest, work, kill_step, timeout_s, log)
    events = work / "run" / "events.jsonl"
    records = read_records(events) if events.exists() else []
    done = [r for r in records if isinstance(r, Done)]
    return {"code": code, "wall_s": time.monotonic() - began, "launch": MODE["launch"],
            "params_sha256": done[-1].params_sha256 if done else None,
            "starts": len(fold(records).starts),  # a group's agent and trainer records are one start
            "steps": [r for r in records if isinstance(r, Step)],
            "checkpoints": [r for r in records if isinstance(r, Checkpoint)],
            "restores": [(r.source, r.step) for r in records if isinstance(r, Restore)],
            "log_tail": (work / "output.log").read_text()[-3000:]}


def _flywheel_run(manifest: dict[str, Any], work: Path, kill_step: int | None, timeout_s: float,
                  log: IO[str]) -> int | None:
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    argv = [sys.executable, "-m", "flywheel.cli", "run", str(path), "--out", str(work / "run"), "--no-progress"]
    if kill_step is not None:
        argv += ["--fault", f"kill:rank=0:step={kill_step}"]
    try:
        return subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, cwd=work).returncode
    except subprocess.TimeoutExpired:
        return None


def _rank_entry(manifest: dict[str, Any], work: Path, kill_step: int | None, timeout_s: float,
                log: IO[str]) -> int | None:
    (work / "run").mkdir(exist_ok=True)
    spec = parse_spec(manifest["spec"])
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "FLYWHEEL_JOB": f"default/{manifest['metadata']['name']}",
           "FLYWHEEL_SPEC": json.dumps(spec.model_dump(by_alias=True, mode="json")),
           "FLYWHEEL_CHECKPOINT_DIR": str(work / "ckpt"), "FLYWHEEL_EVENTS_FILE": str(work / "run" / "events.jsonl")}
    if kill_step is not None:
        env["FLYWHEEL_FAULTS"] = json.dumps([{"id": "f0", "kind": "kill", "rank": 0, "step": kill_step}])
    deadline, code = time.monotonic() + timeout_s, None
    for attempt in range(3):  # a killed rank is started again, as its agent would
        env.update(MASTER_PORT=str(29600 + attempt), TORCHELASTIC_RESTART_COUNT=str(attempt))
        try:
            code = subprocess.run([sys.executable, "-m", "flywheel.trainer"], env=env, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=max(1.0, deadline - time.monotonic()),
                                  cwd=work).returncode
        except subprocess.TimeoutExpired:
            return None
        if code == 0:
            break
    return code


def matmul_tflops(size: int = 8192, repeats: int = 20) -> float | None:
    """The card's bf16 matrix-product rate on random data (median of `repeats`, after warm-up)."""
    import torch

    if not torch.cuda.is_available():
        return None
    a, b = (torch.randn(size, size, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * size**3 / statistics.median(times) / 1e12


def throughput(name: str, manifest: dict[str, Any], work: Path, peak: float, measured: float | None,
               timeout_s: float) -> dict[str, Any]:
    result = run_job(manifest, work / name, None, timeout_s)
    shape = parse_spec(manifest["spec"]).trainer.model.shape()
    rates = [s.tokens_per_second for s in result["steps"][WARMUP_STEPS:] if s.tokens_per_second]
    tps = statistics.median(rates) if rates else None
    flops = shape.flops_per_token()
    row = {"name": name, "launch": result["launch"], "exit": result["code"], "wall_s": round(result["wall_s"], 1),
           "steps": len(result["steps"]), "tokens_per_s": tps, "flops_per_token": flops,
           "step_s_median": statistics.median([s.step_seconds for s in result["steps"][WARMUP_STEPS:]] or [0]),
           "mfu_datasheet": tps * flops / peak if tps else None,
           "mfu_measured_peak": tps * flops / (measured * 1e12) if tps and measured else None,
           "final_loss": result["steps"][-1].loss if result["steps"] else None}
    if not rates:
        row["log_tail"] = result["log_tail"]
    return row


def exact_resume(manifest: dict[str, Any], work: Path, kill_step: int, timeout_s: float,
                 rerun: bool = True) -> dict[str, Any]:
    clean = run_job(manifest, work / "resume-clean", None, timeout_s)
    killed = run_job(manifest, work / "resume-killed", kill_step, timeout_s)
    digest = [r["params_sha256"] for r in (clean, killed)]
    losses = [{s.step: s.loss for s in r["steps"]} for r in (clean, killed)]
    last = max((s.step for s in clean["steps"]), default=0)
    # The last step's save is waited for (training is over): only saves during training show the loop's stall.
    blocking = [round(c.blocking_seconds, 4) for r in (clean, killed) for c in r["checkpoints"] if c.step < last]
    row: dict[str, Any] = {
        "launch": killed["launch"], "exit": [clean["code"], killed["code"]], "params_sha256": digest,
        "equal": digest[0] is not None and digest[0] == digest[1],
        "losses_equal": losses[0] == losses[1] and bool(losses[0]),
        "starts_of_killed_run": killed["starts"], "checkpoints": len(blocking),
        "checkpoint_blocking_s_during_training": blocking,
        "restores_of_killed_run": killed["restores"],
        # The staging buffers are allocated in the background after the first step: steps 2-6 show any cost.
        "first_step_s_clean": [round(s.step_seconds, 4) for s in clean["steps"][:8]],
        "step_s_median_clean": statistics.median([s.step_seconds for s in clean["steps"][WARMUP_STEPS:]] or [0]),
        "checkpoint_total_s_median": statistics.median(
            [c.total_seconds for r in (clean, killed) for c in r["checkpoints"]] or [0])}
    if not row["equal"] and rerun:  # was the clean run itself reproducible? (non-deterministic kernels, not the resume)
        again = run_job(manifest, work / "resume-clean-2", None, timeout_s)
        row["clean_rerun_equal"] = again["params_sha256"] == digest[0]
        row["log_tails"] = [clean["log_tail"], killed["log_tail"]]
    return row


def launcher(work: Path, timeout_s: float) -> dict[str, Any]:
    """`flywheel run` of the tiny GPT on the card: does the product's launcher start ranks here? On failure, the
    ends of its worker logs."""
    manifest = job("launch", {"preset": "gpt-tiny"}, {"globalBatch": 2, "microBatch": 2}, every=10_000, steps=5)
    MODE["launch"], saved = "run", MODE["launch"]
    result = run_job(manifest, work / "launch", None, timeout_s)
    MODE["launch"] = saved
    row: dict[str, Any] = {"exit": result["code"], "steps": len(result["steps"]), "wall_s": round(result["wall_s"], 1)}
    if result["code"] != 0:
        logs = sorted((work / "launch" / "run" / "logs").glob("*"))
        row["worker_logs"] = {p.name: p.read_text()[-2500:] for p in logs[:4]}
    return row


def determinism(model_spec: dict[str, Any], steps: int = 2) -> dict[str, Any]:
    """Is one forward/backward bitwise repeatable on this card under deterministic algorithms, per attention
    kernel? (Exact resume needs it.) Gradients of two identical passes compared, and the warnings torch raised."""
    import warnings

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flywheel.trainer.models.registry import build_model

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = parse_spec(job("d", model_spec, {}, 1, 1)["spec"]).trainer.model.shape()
    model = build_model(shape, seed=0, device=torch.device(device))
    tokens = torch.randint(0, shape.vocab, (4, shape.seq_len + 1), device=device,
                           generator=torch.Generator(device).manual_seed(0))

    def grads() -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()).backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    out: dict[str, Any] = {}
    for name, backends in (("default", None), ("flash", [SDPBackend.FLASH_ATTENTION]),
                           ("efficient", [SDPBackend.EFFICIENT_ATTENTION]), ("math", [SDPBackend.MATH])):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel(backends) if backends else contextlib.nullcontext():
                    first = grads()
                    equal = all(all(torch.equal(a, b) for a, b in zip(first, grads(), strict=True))
                                for _ in range(steps))
                out[name] = {"bitwise_repeatable": equal}
            except RuntimeError as err:
                out[name] = {"error": str(err)[:300]}
        out[name]["warnings"] = sorted({str(w.message)[:200] for w in caught})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gpu_check.json")
    parser.add_argument("--device", help="datasheet peak from the planner's device table (default: from the card's "
                        "name, h200 or h100)")
    parser.add_argument("--smoke", action="store_true", help="tiny models (any machine): the harness alone")
    parser.add_argument("--only", choices=("launch", "determinism", "throughput", "resume"), action="append",
                        help="the parts to run (repeatable; default: all)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per flywheel run")
    parser.add_argument("--cases", nargs="+", help="resume: the cases to run (default: all)")
    parser.add_argument("--no-rerun", action="store_true", help="resume: no second clean run when they differ")
    parser.add_argument("--launch", choices=("run", "rank"), default="run", help="flywheel run, or the rank alone")
    args = parser.parse_args(argv)
    import torch

    MODE["launch"] = args.launch
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    peak = DEVICES[args.device or ("h200" if "H200" in name else "h100")].flops("bf16")
    report: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                              "device": name,
                              "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available()
                              else None, "datasheet_bf16_flops": peak}
    report["matmul_bf16_tflops"] = matmul_tflops()
    print(json.dumps(report), flush=True)
    llama = {"preset": "llama-tiny"} if args.smoke else {"preset": "llama3-1b", "seqLen": 2048}
    bf16 = {"precision": "bf16", "deterministic": False, "globalBatch": 4 if not args.smoke else 2,
            "microBatch": 4 if not args.smoke else 2}
    steps = 12 if args.smoke else 30
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        parts = args.only or ["launch", "determinism", "throughput", "resume"]
        if "launch" in parts:
            report["launch"] = launcher(work, min(args.timeout, 120))
            print(json.dumps(report["launch"]), flush=True)
        if "determinism" in parts:
            report["determinism"] = determinism({"preset": "gpt-tiny"} if args.smoke else
                                                {"preset": "gpt-125m", "seqLen": 1024})
            print(json.dumps(report["determinism"]), flush=True)
        if "throughput" in parts:
            report["throughput"] = []
            # What exactness costs (deterministic: true against the eager row) and the chunked loss's speed.
            for name, extra in (("llama3-1b-bf16-eager", {}), ("llama3-1b-bf16-compile", {"compile": True}),
                                ("llama3-1b-bf16-deterministic", {"deterministic": True}),
                                ("llama3-1b-bf16-chunked-loss", {"chunkedLoss": True})):
                manifest = job(name, llama, {**bf16, **extra}, every=10_000, steps=steps)
                row = throughput(name, manifest, work, peak, report["matmul_bf16_tflops"], args.timeout)
                if not row["steps"] and MODE["launch"] == "run":  # the launcher failed here: the rank alone
                    report.setdefault("launch_failures", []).append(row)
                    MODE["launch"] = "rank"
                    row = throughput(name, manifest, work / "rank", peak, report["matmul_bf16_tflops"],
                                     args.timeout)
                report["throughput"].append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "log_tail"}), flush=True)
        if "resume" in parts:
            report["exact_resume"] = {}
            gpt = {"preset": "gpt-tiny"} if args.smoke else {"preset": "gpt-125m", "seqLen": 1024}
            cases = {"gpt-125m-fp32": (job("resume", gpt, {"globalBatch": 8, "microBatch": 8}, every=20, steps=45),
                                       25),
                     "gpt-125m-fp32-memory": (job("resume-memory", gpt, {"globalBatch": 8, "microBatch": 8},
                                                  every=20, steps=45, memory_every=5), 27),
                     "llama-tiny-bf16": (job("resume-bf16", {"preset": "llama-tiny"},
                                             {"globalBatch": 8, "microBatch": 8, "precision": "bf16"}, every=10,
                                             steps=30), 15)}
            for name, (manifest, kill) in cases.items():
                if args.cases and name not in args.cases:
                    continue
                if args.smoke:
                    manifest["spec"]["trainer"]["training"]["steps"], kill = 15, 8
                    manifest["spec"]["checkpoint"]["everySteps"] = 5
                row = exact_resume(manifest, work / name, kill_step=kill, timeout_s=args.timeout,
                                   rerun=not args.no_rerun)
                report["exact_resume"][name] = row
                print(json.dumps({name: {k: v for k, v in row.items() if k != "log_tails"}}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
