"""Where the time from `flywheel run` to the first step goes, per model preset, on this machine's CPU.

`flywheel run` of one worker with one rank (warm start, the spec's checkpoint and watchdog defaults), seqLen capped
at SEQ_CAP and one sample per step, so the first step stays the model's own work and not a long CPU step. The rank
reports its phases (flywheel/trainer/startup.py: rank 0's `start` event, `startup_seconds`); here they are printed
beside what came before the rank (`launch`: the CLI, the supervisor, the agent and its warm zygote's imports, up to
the rank process's start) and the first step (its `step` event). Presets too large for this machine's memory with
their optimizer state are stopped at the `start` event (their phases up to the restore; no first step).

    python -m bench.startup_phases [--quick] [--preset NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import RESULTS, machine
from flywheel.local.procs import kill_tree

REPO = Path(__file__).resolve().parents[1]
SEQ_CAP = 256
# name -> stop at the `start` event (parameters, gradients and AdamW's two moments in fp32 would not fit in memory
# beside the others' work on this machine: llama3-1b needs ~20 GB; gpt-1.3b ~21 GB; llama3-8b's parameters alone
# are 32 GB, more than the machine has, so it is not run).
PRESETS = {"gpt-tiny": False, "llama-tiny": False, "gpt-125m": False, "gpt-350m": False, "llama3-1b": True}
QUICK = ("gpt-tiny", "llama-tiny")


def job(preset: str, workdir: Path) -> dict[str, Any]:
    from flywheel.layout.shape import PRESETS as SHAPES

    model = {"preset": preset, "seqLen": min(SHAPES[preset].seq_len, SEQ_CAP)}
    return {"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "startup"},
            "spec": {"replicas": {"min": 1, "max": 1}, "procsPerReplica": 1,
                     "trainer": {"model": model, "parallelism": {"fsdp": True},
                                 "training": {"steps": 2, "globalBatch": 1, "microBatch": 1, "warmupSteps": 1}},
                     "checkpoint": {"dir": str(workdir / "ckpt")},
                     "faultTolerance": {"firstStepTimeoutSeconds": 900}}}


def _events(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError):  # not there yet, or a line being written
        return []


def measure(preset: str, stop_at_start: bool, workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True)
    (workdir / "job.yaml").write_text(yaml.safe_dump(job(preset, workdir)))
    out = workdir / "run"
    env = dict(os.environ, OMP_NUM_THREADS=str(os.cpu_count() or 1), PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "flywheel.cli", "run", str(workdir / "job.yaml"), "--out", str(out), "--no-progress"]
    with (workdir / "flywheel.log").open("wb") as log:
        began = time.time()
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 1200
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
        if stop_at_start and any(_is_trainer_start(e) for e in _events(out / "events.jsonl")):
            break
    if proc.poll() is None:
        kill_tree(proc.pid)
        proc.wait()
    events = _events(out / "events.jsonl")
    start = next((e for e in events if _is_trainer_start(e)), None)
    if start is None:
        raise RuntimeError(f"{preset}: no start event; see {workdir / 'flywheel.log'}")
    phases: dict[str, float] = dict(start.get("startup_seconds") or {})
    rank_began = start["time"] - sum(phases.values())
    steps = [e for e in events if e.get("event") == "step"]
    if steps:
        phases["first_step"] = steps[0]["step_seconds"]
    return {"preset": preset, "launch": rank_began - began, "phases": phases,
            "to_first_step": steps[0]["time"] - began if steps else None}


def _is_trainer_start(event: dict[str, Any]) -> bool:
    return event.get("event") == "start" and event.get("source") != "agent"


def report(rows: list[dict[str, Any]]) -> None:
    names = list(dict.fromkeys(name for row in rows for name in row["phases"]))
    print(f"{'preset':<12}{'to step 1':>10}{'launch':>8}" + "".join(f"{n[:11]:>12}" for n in names))
    for row in rows:
        total = f"{row['to_first_step']:.2f}" if row["to_first_step"] else "-"
        print(f"{row['preset']:<12}{total:>10}{row['launch']:>8.2f}"
              + "".join(f"{row['phases'][n]:>12.2f}" if n in row["phases"] else f"{'-':>12}" for n in names))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--preset", action="append", choices=sorted(PRESETS))
    parser.add_argument("--out", type=Path, help="the result file (default bench/results/startup_phases.json)")
    args = parser.parse_args(argv)
    chosen = args.preset or (list(QUICK) if args.quick else list(PRESETS))
    with tempfile.TemporaryDirectory(prefix="fw-startup-") as tmp:
        rows = [measure(name, PRESETS[name], Path(tmp) / name) for name in chosen]
    report(rows)
    out = args.out or RESULTS / "startup_phases.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine(), "seq_cap": SEQ_CAP, "quick": args.quick, "rows": rows},
                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
