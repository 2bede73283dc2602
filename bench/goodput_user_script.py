"""Goodput of a user's own training script: the Hugging Face Trainer example (examples/scripts/hf_trainer.py, a tiny
GPT-2 over gloo, 2 workers x 1 rank, its own `save_steps` checkpoints and `get_last_checkpoint` resume) under
`flywheel run examples/hf-trainer.yaml` against the same script under plain `torchrun --max-restarts`, with the same
rank SIGKILLs, in one run.

- Ours: the example job as documented (its FlywheelCallback reports steps and saves; each worker's elastic agent
  restarts the ranks in place), `maxRestarts` raised so the budget never ends a run.
- Peer: two `torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --max-restarts 100` processes on
  localhost, as a user types them (monitor interval and rendezvous defaults), running the same file; beside it
  `torchrun-tuned`, the same with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (with the shared store a restarted group
  hung in its rendezvous here, as in pytorch#135712), the strongest torchrun we know. The only
  addition is a measuring tap: FLYWHEEL_JOB and FLYWHEEL_EVENTS_FILE in its environment make the same callback
  write the same step records (the callback costs the same on both sides). torchrun logs no group start in that
  file, so a start is read from the records: a `restore` record, or a step not above the previous one (a group
  that began again without a checkpoint).
- Schedule (bench/goodput_faults.py): a rank SIGKILL at (k + 1/2) x T after the first step, victims from a seeded
  RNG, the same for both sides; a fault waits until the group trains again.

Goodput = useful steps x clean step time / wall time from the first step to the last, the clean step time each
side's own pace (median step) scaled by its fault-free run's mean-to-median ratio, as bench/goodput.py does. Per
fault: restart latency (kill -> first step of the restarted group) and lost steps (trained again since the
script's last checkpoint).

    python -m bench.goodput_user_script           # clean runs, then ~240 s of training at 1 kill / min per side
    python -m bench.goodput_user_script --quick   # a short run with one kill per side (~3 min; CI's smoke)
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.common import RESULTS, write_result
from bench.goodput import clean_step_s, pace, summarise
from bench.goodput_faults import Injector, agent_failure_times, analyse_faults, read_events, schedule, stop_run
from flywheel.eventlog import EventTail, Record, Restore, Start, Step

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "hf-trainer.yaml"
SCRIPT = REPO / "examples" / "scripts" / "hf_trainer.py"
WORKERS = 2
SAVE_STEPS = 50
GOAL_RATIO = 1.2
STALL_LIMIT_S = 150.0  # no step for this long: the side did not recover; the run ends there
SIDES = {"ours": "flywheel run examples/hf-trainer.yaml (the agent restarts the ranks in place)",
         "torchrun": "torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --max-restarts 100, defaults",
         "torchrun-tuned": "the same with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"}
PEERS = ("torchrun", "torchrun-tuned")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(steps: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLYWHEEL_", "PET_", "TORCHELASTIC_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1",
               HF_STEPS=str(steps), HF_SAVE_STEPS=str(SAVE_STEPS))
    return env


def launch(side: str, workdir: Path, steps: int) -> tuple[list[subprocess.Popen], Path, list[Path]]:
    """Start one side; returns (launcher processes, events file, agent logs)."""
    workdir.mkdir(parents=True)
    env, ckpt = _env(steps), workdir / "ckpt"
    if side == "ours":
        doc = yaml.safe_load(EXAMPLE.read_text())
        doc["metadata"]["name"] = workdir.name
        doc["spec"]["command"] = [str(SCRIPT)]
        doc["spec"]["checkpoint"]["dir"] = str(ckpt)
        doc["spec"]["faultTolerance"]["maxRestarts"] = 100
        (workdir / "job.yaml").write_text(yaml.safe_dump(doc))
        out = workdir / "run"
        with open(workdir / "flywheel-run.log", "wb") as log:
            popen = subprocess.Popen([sys.executable, "-m", "flywheel.cli", "run", str(workdir / "job.yaml"), "--out",
                                      str(out), "--no-progress"], cwd=REPO, env=env, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        return [popen], out / "events.jsonl", [out / "logs" / f"worker-{i}.log" for i in range(WORKERS)]
    events = workdir / "events.jsonl"
    if side == "torchrun-tuned":
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env.update(FLYWHEEL_CHECKPOINT_DIR=str(ckpt), FLYWHEEL_JOB=f"default/{workdir.name}",
               FLYWHEEL_EVENTS_FILE=str(events))  # the measuring tap (module docstring)
    endpoint = f"127.0.0.1:{_free_port()}"
    popens, logs = [], []
    for node in range(WORKERS):
        logs.append(workdir / f"torchrun-{node}.log")
        with open(logs[-1], "wb") as log:
            argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(WORKERS), "--nproc-per-node", "1",
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", workdir.name,
                    "--max-restarts", "100", str(SCRIPT)]
            popens.append(subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))
        if node == 0:
            time.sleep(0.5)  # node 0 hosts the rendezvous store on the endpoint
    return popens, events, logs


def with_inferred_starts(records: list[Record]) -> list[Record]:
    """The records with a `start` before each group's first record, read from the records themselves (torchrun
    writes none): a restore, or a step not above the previous step, begins a group."""
    out: list[Record] = []
    last_step, restored = 0, False
    for r in records:
        if isinstance(r, Restore) or (isinstance(r, Step) and r.step <= last_step and not restored) or not out:
            out.append(Start(r.time - 1e-3))
        if isinstance(r, Step):
            last_step, restored = r.step, False
        elif isinstance(r, Restore):
            restored = True
        out.append(r)
    return out


@dataclass
class InferringInjector(Injector):
    """The schedule's injector for a side that logs no starts: it sees the starts with_inferred_starts reads."""

    seen: list[Record] = field(default_factory=list)
    given: int = 0

    def _new_records(self, tail: EventTail) -> list[Record]:
        self.seen += tail.read_new()
        inferred = with_inferred_starts(self.seen)
        new, self.given = inferred[self.given:], len(inferred)
        return new


def run_side(side: str, workdir: Path, steps: int, period_s: float | None, seed: int, timeout_s: float,
             max_faults: int | None = None) -> dict[str, Any]:
    began = time.time()
    popens, events_file, logs = launch(side, workdir, steps)
    injector = None
    if period_s:
        plan = schedule(seed, period_s, horizon_s=timeout_s, world=WORKERS, replicas=WORKERS)[:max_faults]
        kind = Injector if side == "ours" else InferringInjector
        injector = kind(plan, events_file, [p.pid for p in popens], stop_at_step=steps - SAVE_STEPS).start()
    try:
        ended_by = _watch(popens, events_file, timeout_s)
    finally:
        ended = stop_run(injector, popens)
    records = read_events(events_file)
    events = records if side == "ours" else with_inferred_starts(records)
    steps_seen = [e for e in events if isinstance(e, Step)]
    fired = injector.fired if injector else []
    faults = analyse_faults(fired, events, agent_failure_times(logs))
    useful = max((e.step for e in steps_seen), default=0)
    finished = ended_by == "finished" and useful == steps
    window_end = steps_seen[-1].time if finished and steps_seen else ended
    return {"side": side, "steps": steps, "period_s": period_s, "wall_s": ended - began, "ended_by": ended_by,
            "exit_codes": [p.returncode for p in popens], "finished": finished, "useful_steps": useful,
            "step_attempts": len(steps_seen), "starts": sum(isinstance(e, Start) for e in events),
            "window_s": window_end - steps_seen[0].time if steps_seen else None, "pace_s": pace(steps_seen),
            "first_step_after_launch_s": steps_seen[0].time - began if steps_seen else None,
            "faults": faults, "load_average_1m": os.getloadavg()[0]}


def _watch(popens: list[subprocess.Popen], events_file: Path, timeout_s: float) -> str:
    """Until every launcher exited (or one failed, stalled, or ran out of time): how the run ended."""
    deadline, last_size, last_progress = time.monotonic() + timeout_s, -1, time.monotonic()
    while any(p.poll() is None for p in popens):
        size = events_file.stat().st_size if events_file.exists() else 0
        if size != last_size:
            last_size, last_progress = size, time.monotonic()
        if time.monotonic() > deadline:
            return "timeout"
        if time.monotonic() - last_progress > STALL_LIMIT_S:
            return "stalled"
        if any(p.poll() not in (None, 0) for p in popens):
            return "gave-up"
        time.sleep(0.2)
    return "finished" if all(p.returncode == 0 for p in popens) else "gave-up"


def run_length(secs: float, period_s: float, clean_runs: list[dict[str, Any]]) -> int:
    """Steps of a faulted run: `secs` of training at the faster clean side's pace, and long enough that the first
    fault (half a period in) comes before the last save interval."""
    fastest = min(run["pace_s"] for run in clean_runs if run["pace_s"])
    return max(int(secs / fastest), SAVE_STEPS + math.ceil(period_s / fastest), 3 * SAVE_STEPS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one kill per side in a short run (CI's smoke)")
    parser.add_argument("--period", type=float, help="seconds between kills (default 60; quick 10)")
    parser.add_argument("--seconds", type=float, help="fault-free training seconds of each faulted run (default 240)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "goodput_user_script.json")
    args = parser.parse_args(argv)
    period = args.period or (10.0 if args.quick else 60.0)
    secs = args.seconds or (12.0 if args.quick else 240.0)
    clean_steps, max_faults = (3 * SAVE_STEPS, 1) if args.quick else (6 * SAVE_STEPS, None)
    started = time.monotonic()
    runs: dict[str, Any] = {"clean": {}, "faulted": {}}
    # Quick (CI's smoke): the plain torchrun is left out; its restarted group hung here until the stall limit.
    sides = ("ours", "torchrun-tuned") if args.quick else tuple(SIDES)
    with tempfile.TemporaryDirectory(prefix="goodput-user-") as tmp:
        for side in sides:
            clean_side = "torchrun-tuned" if side == "torchrun" else side  # without faults the two run the same
            if clean_side in runs["clean"]:
                continue
            run = run_side(clean_side, Path(tmp) / f"{clean_side}-clean", clean_steps, None, args.seed, timeout_s=600)
            runs["clean"][clean_side] = run
            print(f"{clean_side} clean: {run['useful_steps']}/{clean_steps} steps ({run['ended_by']}), "
                  f"{_ms(run['pace_s'])} ms/step, first step {run['first_step_after_launch_s'] or 0:.1f} s after "
                  f"launch, wall {run['wall_s']:.0f} s", flush=True)
        steps = run_length(secs, period, list(runs["clean"].values()))
        for side in sides:
            clean = runs["clean"]["torchrun-tuned" if side == "torchrun" else side]
            run = run_side(side, Path(tmp) / f"{side}-{period:g}s", steps, period, args.seed,
                           timeout_s=secs * 4 + 300, max_faults=max_faults)
            run["clean_pace_s"] = clean["pace_s"]
            run["summary"] = summarise(run, clean_step_s(clean), clean_step_s(runs["clean"]["ours"]))
            runs["faulted"][side] = run
            s = run["summary"]
            print(f"{side} 1 kill / {period:g} s: {run['useful_steps']}/{steps} steps ({run['ended_by']}), goodput "
                  f"{s['goodput']:.3f}, {s['recovered']}/{s['faults']} faults recovered, restart median "
                  f"{_fmt(s['restart_median_s'])} s, lost steps {s['lost_steps_total']}, wall {run['wall_s']:.0f} s",
                  flush=True)
    return report(args, runs, period, started)


def report(args: argparse.Namespace, runs: dict[str, Any], period: float, started: float) -> int:
    summaries = {side: run["summary"] for side, run in runs["faulted"].items()}
    ours = summaries["ours"]
    ratios = {side: ours["goodput"] / s["goodput"] if s["goodput"] else None
              for side, s in summaries.items() if side != "ours"}
    peer = next(side for side in PEERS if side in summaries)  # the plain torchrun, the peer, when it ran
    ratio = ratios[peer]
    checks = {f">= {GOAL_RATIO}x {peer}'s goodput at 1 kill / {period:g} s": ratio is None or ratio >= GOAL_RATIO,
              "every fault recovered on our side": ours["recovered"] == ours["faults"] > 0}
    passed = all(checks.values()) and not args.quick and period == 60.0
    restart = {side: s["restart_median_s"] for side, s in summaries.items()}
    rows = [{"name": f"restart vs {side}",
             "metric": "restart latency, median (kill -> first step of the restarted group)",
             "value": restart["ours"], "unit": "s", "peer": f"the same script under {side}",
             "peer_value": restart[side],
             "ratio": restart["ours"] / restart[side] if restart["ours"] and restart[side] else None,
             "goal": "none (reported)", "pass": None} for side in ratios]
    rows += [{"name": f"goodput vs {side}", "metric": "goodput, the same run", "value": ours["goodput"],
              "unit": "ratio", "peer": SIDES[side], "peer_value": summaries[side]["goodput"], "ratio": ratios[side],
              "goal": "none (reported)", "pass": None} for side in ratios if side != peer]
    write_result("goodput_user_script", path=args.out,
                 metric=f"goodput of the HF Trainer example at 1 rank SIGKILL per {period:g} s (useful steps x clean "
                        "step time / training wall time)", value=ours["goodput"], unit="ratio",
                 peer=SIDES[peer] + ", the same script and kills", peer_value=summaries[peer]["goodput"],
                 ratio=ratio, ratios_by_peer=ratios, goal=f">= {GOAL_RATIO}x torchrun's at 1 kill / min",
                 passed=passed, checks=checks, quick=args.quick, seed=args.seed, runs=runs, rows=rows,
                 bench_seconds=time.monotonic() - started, load_average_1m=os.getloadavg()[0])
    print(f"ours {ours['goodput']:.3f}, restart median {_fmt(restart['ours'])} s; "
          + "; ".join(f"{side} {summaries[side]['goodput']:.3f} (ratio {_fmt(r)}), restart median "
                      f"{_fmt(restart[side])} s" for side, r in ratios.items()) + "; "
          + "; ".join(f"{k}: {'PASS' if v else 'FAIL'}" for k, v in checks.items())
          + f"{' (quick: not judged)' if args.quick else ''} -> {args.out}", flush=True)
    return 0


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f}"


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


if __name__ == "__main__":
    sys.exit(main())
