"""Goodput through the operator: the goodput run of bench/goodput.py (tiny GPT, 2 workers x 2 ranks, DDP, a fixed
number of steps) as a TrainingJob on the test cluster, with pod-level faults every T seconds:

- `kill-rank`: SIGKILL of one rank process inside a worker pod (the worker's agent fails, the pod ends, the
  operator restarts the job);
- `delete-pod`: `kubectl delete pod` of a worker (graceful; the operator creates its replacement);
- `lose-node`: the node of a worker dies (kubelet heartbeats stop, its processes freeze; the etcd lease expires,
  the pod is force-deleted after `nodeFailureGraceSeconds` 5 s and replaced on the other node; the node comes
  back once the job trains again).

Kinds rotate in that order and the victim comes from a seeded RNG. A fault fires only while the job trains (never
inside the previous recovery). Goodput = useful steps x clean step time / wall time from the first step to the
last, the clean step time from a fault-free run of the same job in the same invocation. Per fault: detection
(fault -> the operator's first action: `status.restarts` grows or a worker pod is replaced), restart (fault ->
first step of the next start), lost steps (steps done before the fault and replayed after it). Reported apart
from the local run (bench/goodput.py); no peer runs here: the peer value is the fault-free run's goodput (1.0).

Two configurations run the same faults in one invocation (on 3 nodes, so a spare can sit apart from the workers):
"no spares" (the baseline; the result's `value`), and "spares + memory checkpoints" (`replicas.spares: 1`,
`checkpoint.memoryEverySteps: 10`), reported beside it (`runs.configs`) with the issue's goals: goodput >= 0.90, a
deleted pod <= 3.5 s and a lost node <= 7 s from the fault to the first step after (medians).

    python -m bench.goodput_operator            # one fault per 60 s over ~6 min of training (~9 min)
    python -m bench.goodput_operator --quick    # one fault of each kind, every 4 s, 12 s of training (~1 min)
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.cluster_bed import KUBECTL, Bed, wait
from bench.common import RESULTS, median, write_result
from bench.goodput_faults import agent_failure_times, analyse_faults, find_ranks, read_events
from flywheel.eventlog import Record, Start, Step
from flywheel.local import procs

KINDS = ("kill-rank", "delete-pod", "lose-node")
REPLICAS, PROCS, CKPT_EVERY, NODE_FAILURE_GRACE_S = 2, 2, 50, 5
GOALS = {60.0: 0.85, 300.0: 0.95}  # the local run's goals (issue 8), shown for reference
NODES = 3  # two workers and a spare apart from them
# name -> (spares, checkpoint.memoryEverySteps)
# A memory copy every 10 steps: one every step cost this CPU-only model ~35% of its throughput (1,250 steps a minute
# against 2,000 in a full run: a 12 MB copy and a peer send per rank per 27 ms step on 2 shared cores), which the
# goodput (against the fault-free run without copies) charges; every 10 steps a fault replays at most 9 steps.
MEMORY_EVERY = 10
CONFIGS = {"no-spares": (0, 0), "spares-memory": (1, MEMORY_EVERY)}
SPARES_GOALS = {"goodput": 0.90, "delete-pod": 3.5, "lose-node": 7.0}  # issue 21, at one fault a minute


class ActionClock(threading.Thread):
    """Wall times of the operator's actions on a job: `status.restarts` growing, a worker pod replaced."""

    def __init__(self, bed: Bed, job: str) -> None:
        super().__init__(daemon=True)
        self.bed, self.job, self.times, self.halt = bed, job, [], threading.Event()

    def run(self) -> None:
        restarts, uids = 0, {}
        while not self.halt.wait(0.2):
            try:
                status = self.bed.get("tj", self.job).get("status", {})
                pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in self.bed.pods(self.job)}
            except (subprocess.SubprocessError, ValueError, KeyError):  # a kubectl hiccup: the next poll
                continue
            now = time.time()
            replaced = any(name in uids and uids[name] != uid for name, uid in pods.items())
            if int(status.get("restarts", 0)) > restarts or replaced:
                self.times.append(now)
            restarts, uids = int(status.get("restarts", 0)), {**uids, **pods}


def training_since(events: list[Record], t: float) -> bool:
    """The group was (re)started after `t` and has stepped since: recovered from a fault at `t`. A step logged
    just after a fault by the old group (in flight) does not count."""
    starts = [e.time for e in events if isinstance(e, Start)]
    steps = [e.time for e in events if isinstance(e, Step)]
    return bool(starts and steps) and max(starts) > t and max(steps) > max(starts)


def inject(bed: Bed, job: str, kind: str, rng: random.Random) -> dict[str, Any] | None:
    """Fires one fault at a running worker; None when there is none to hit yet (the caller tries again)."""
    pods = [p for p in bed.pods(job) if (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
            and (p["metadata"].get("labels") or {}).get("flywheel.dev/role") != "spare"]
    if len(pods) < REPLICAS:
        return None
    pod = rng.choice(sorted(pods, key=lambda p: p["metadata"]["name"]))
    name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
    placement = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in bed.pods(job)}
    fault: dict[str, Any] = {"kind": kind, "pod": name, "node": node, "placement": placement}
    if kind == "kill-rank":
        pid = bed.cluster.kubelet.pid_of("default", name)
        ranks = find_ranks([pid]) if pid else {}
        if not ranks:
            return None
        rank = rng.choice(sorted(ranks))
        fault.update(rank=rank, time=time.time())
        procs.signal_quietly(ranks[rank], signal.SIGKILL)
    elif kind == "delete-pod":
        fault["time"] = time.time()
        bed.kubectl("delete", "pod", name, "--wait=false")
    else:
        fault["time"] = time.time()
        bed.cluster.kubelet.lose_node(node)
    return fault


def run_job(bed: Bed, name: str, steps: int, period_s: float | None, seed: int,
            max_faults: int = 1_000, spares: int = 0, memory_every: int = 0) -> dict[str, Any]:
    bed.apply_job(name, steps=steps, checkpoint_every=CKPT_EVERY, node_failure_grace_s=NODE_FAILURE_GRACE_S,
                  replicas=REPLICAS, procs_per_replica=PROCS, max_restarts=100, spares=spares,
                  memory_every_steps=memory_every)
    clock = ActionClock(bed, name)
    clock.start()
    rng, fired, lost_nodes = random.Random(seed), [], []
    began = time.time()
    path = wait(f"{name}'s event log", lambda: bed.events_file(name), 300, interval=0.2)
    first = wait(f"{name}'s first step", lambda: next((e.time for e in read_events(path)
                                                       if isinstance(e, Step)), None), 300, interval=0.1)
    deadline = time.time() + 60 * 60
    while time.time() < deadline:
        phase = bed.get("tj", name).get("status", {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            break
        events = read_events(path)
        last_step = max((e.step for e in events if isinstance(e, Step)), default=0)
        recovered = training_since(events, fired[-1]["time"] if fired else 0.0)
        if lost_nodes and recovered:  # the dead node comes back once the job trains without it
            bed.cluster.kubelet.restore_node(lost_nodes.pop())
        due = period_s is not None and time.time() >= first + (len(fired) + 0.5) * period_s
        if due and recovered and last_step < steps - 20 and len(fired) < max_faults:
            fault = inject(bed, name, KINDS[len(fired) % len(KINDS)], rng)
            if fault is None:
                time.sleep(0.1)
                continue
            fault.update(planned_s=(len(fired) + 0.5) * period_s, step_at_fault=last_step)
            fired.append(fault)
            if fault["kind"] == "lose-node":
                lost_nodes.append(fault["node"])
            print(f"  {name}: {fault['kind']} {fault['pod']} at step {last_step}", flush=True)
        time.sleep(0.1)
    for node in lost_nodes:
        bed.cluster.kubelet.restore_node(node)
    clock.halt.set()
    clock.join(5)
    events = read_events(path)
    steps_ev = [e for e in events if isinstance(e, Step)]
    # A killed rank is handled by its worker's agent (a new round of the etcd rendezvous) without the operator:
    # its detection is the agent's failure line in the pod's log.
    pod_logs = sorted({*bed.workdir.glob(f"cluster/**/default_{name}-worker-*.log"),
                       *bed.workdir.glob(f"cluster/**/default_{name}-spare-*.log")})  # a promoted spare's too
    agent_failures = agent_failure_times(pod_logs)
    status = bed.get("tj", name).get("status", {})
    phase = status.get("phase")
    return {"name": name, "phase": phase, "goodput_status": status.get("goodput"),
            "last_restore": status.get("lastRestore"), "steps": steps, "fired": fired, "first_step": first,
            "last_step_time": steps_ev[-1].time, "wall_s": steps_ev[-1].time - first,
            "e2e_s": steps_ev[-1].time - began,
            "operator_actions": clock.times, "agent_failures": agent_failures,
            "faults": analyse_faults(fired, events, agent_failures, clock.times) if fired else []}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--period", type=float, default=60.0, help="seconds between faults")
    parser.add_argument("--minutes", type=float, default=6.0, help="training length of the faulted run")
    parser.add_argument("--clean-steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-faults", type=int, default=1_000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "goodput_operator.json")
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=list(CONFIGS),
                        help="which configurations to run (default: both, the baseline first)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the test bed's files (operator log, pod logs, event logs) in this folder")
    args = parser.parse_args()
    if args.quick:
        # Each fault fires once the job trains again after the previous one: one of each kind, back to back.
        args.period, args.minutes, args.clean_steps, args.max_faults = 4.0, 0.2, 40, 3
    if not KUBECTL.exists():
        print("kubectl missing: run scripts/install-tools.sh")
        return 2
    with tempfile.TemporaryDirectory(prefix="goodput-operator-") as tmp:
        workdir = Path(tmp)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=False)
            workdir = args.keep.resolve()
        bed = Bed(workdir, node_grace=40.0, nodes=NODES)
        try:
            clean = run_job(bed, "clean", args.clean_steps, None, args.seed)
            step_s = clean["wall_s"] / (args.clean_steps - 1)
            steps = max(100, int(args.minutes * 60 / step_s))
            print(f"clean: {step_s * 1000:.1f} ms/step; faulted runs: {steps} steps", flush=True)
            runs = {config: run_job(bed, f"faults-{config}", steps, args.period, args.seed, args.max_faults,
                                    *CONFIGS[config]) for config in args.configs}
        finally:
            bed.close()
    configs = {config: summarize(run, step_s, args.period) for config, run in runs.items()}
    baseline = configs.get("no-spares") or next(iter(configs.values()))
    goal = GOALS.get(args.period)
    passed = all(c["phase"] == "Succeeded" for c in configs.values()) and (goal is None or baseline["goodput"] >= goal)
    spares = configs.get("spares-memory")
    spares_pass = spares is not None and spares["phase"] == "Succeeded" and spares_met(spares)
    write_result("goodput_operator", path=args.out, metric=f"goodput, one pod-level fault per {args.period:g} s",
                 value=baseline["goodput"], unit="ratio", peer="fault-free run, same job", peer_value=1.0,
                 goal=f">= {goal} and Succeeded" if goal else "Succeeded (no goal at this fault rate)",
                 passed=passed, runs={"clean": clean, "faulted": runs.get("no-spares"), "clean_step_s": step_s,
                                      "by_kind": baseline["by_kind"], "configs": configs,
                                      "faulted_runs": runs},
                 quick=args.quick, period_s=args.period,
                 spares_goal=f"goodput >= {SPARES_GOALS['goodput']}, delete-pod <= {SPARES_GOALS['delete-pod']} s, "
                             f"lose-node <= {SPARES_GOALS['lose-node']} s (medians)",
                 spares_pass=spares_pass, rows=[spares_row(spares)] if spares is not None else [])
    for config, c in configs.items():
        print(f"{config}: goodput {c['goodput']:.3f} over {c['wall_s']:.0f} s with {c['faults']} faults, "
              f"{c['phase']}")
    print(f"{'PASS' if passed else 'FAIL'} (baseline); spares goals {'met' if spares_pass else 'not met'} "
          f"-> {args.out}")
    return 0


def summarize(run: dict[str, Any], step_s: float, period_s: float) -> dict[str, Any]:
    """One configuration's goodput, its per-fault table and the per-kind medians."""
    goodput = run["steps"] * step_s / run["wall_s"]
    rows = run["faults"]
    table = Table(title=f"{run['name']}: goodput {goodput:.3f} (one fault / {period_s:g} s)")
    for column in ("fault", "pod", "step", "detect s", "restart s", "lost steps"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(r["kind"], r["pod"], str(r["step_at_fault"]),
                      *(f"{r[k]:.1f}" if r[k] is not None else "-" for k in ("detect_s", "restart_s")),
                      str(r["lost_steps"]))
    Console().print(table)
    by_kind = {k: {m: median([r[m] for r in rows if r["kind"] == k and r[m] is not None])
                   for m in ("detect_s", "restart_s", "lost_steps")} for k in KINDS}
    return {"goodput": goodput, "phase": run["phase"], "wall_s": run["wall_s"], "faults": len(rows),
            "by_kind": by_kind, "last_recovery": (run.get("goodput_status") or {}).get("lastRecovery"),
            "badput_seconds": (run.get("goodput_status") or {}).get("badputSeconds"),
            "last_restore": run.get("last_restore")}


def spares_row(config: dict[str, Any]) -> dict[str, Any]:
    """The spares configuration's row of the report: its goodput beside the baseline's run, with the issue's goals."""
    by_kind = config["by_kind"]
    parts = ", ".join(f"{kind} {by_kind[kind]['restart_s']:.1f} s" for kind in KINDS
                      if by_kind.get(kind, {}).get("restart_s") is not None)
    return {"name": "spares + memory checkpoints",
            "metric": f"goodput with replicas.spares 1 and checkpoint.memoryEverySteps {MEMORY_EVERY} (fault -> first "
                      "step after, "
                      f"medians: {parts})",
            "value": config["goodput"], "unit": "ratio", "peer": "goal", "peer_value": SPARES_GOALS["goodput"],
            "ratio": config["goodput"] / SPARES_GOALS["goodput"],
            "goal": f">= {SPARES_GOALS['goodput']}, delete-pod <= {SPARES_GOALS['delete-pod']} s, lose-node <= "
                    f"{SPARES_GOALS['lose-node']} s (medians), Succeeded",
            "pass": config["phase"] == "Succeeded" and spares_met(config)}


def spares_met(config: dict[str, Any]) -> bool:
    by_kind = config["by_kind"]

    def within(kind: str) -> bool:
        value = by_kind.get(kind, {}).get("restart_s")
        return value is not None and value <= SPARES_GOALS[kind]

    return config["goodput"] >= SPARES_GOALS["goodput"] and within("delete-pod") and within("lose-node")


if __name__ == "__main__":
    sys.exit(main())
