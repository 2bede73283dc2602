"""Goodput through the operator: the goodput run of bench/goodput.py (tiny GPT, 2 workers x 2 ranks, DDP, a fixed
number of steps) as a TrainingJob on the test cluster, with pod-level faults every T seconds:

- `kill-rank`: SIGKILL of one rank process inside a worker pod (the worker's agent fails, the pod ends, the
  operator restarts the job);
- `delete-pod`: `kubectl delete pod` of a worker (graceful; the operator creates its replacement);
- `lose-node`: the node of a worker dies (kubelet heartbeats stop, its processes freeze; the etcd lease expires,
  the pod is force-deleted after `nodeFailureGraceSeconds` 5 s and replaced on the other node; the node comes
  back once the job trains again);
- `drain-node`: the node of a worker gets a maintenance notice, the `NoSchedule` taint AWS Node Termination Handler
  sets for EC2 scheduled maintenance (one of the operator's default `--drain-taint-keys`): the operator drains
  ahead (every rank checkpoints at the next step boundary, then the worker moves to the spare or a new pod; see
  docs/operator.md, "Drain ahead"); the taint goes once the job trains again (the maintenance is over).

Kinds rotate in that order and the victim comes from a seeded RNG. A fault fires only while the job trains (never
inside the previous recovery). Goodput = useful steps x clean step time / wall time from the first step to the
last, the clean step time from a fault-free run of the same job (each configuration its own: its spare and its
memory copies share these 2 cores with the training, which a fault-free run pays too; that cost, and the goodput
against the plain job, are reported beside it) in the same invocation. Per fault: detection
(fault -> the operator's first action: `status.restarts` grows or a worker pod is replaced), restart (fault ->
first step of the next start), stall (the last step trained before that first step -> it: the time nothing
trained; for a drain the job trains on after the taint until its checkpoint, so this is the drain's cost, where
restart also counts those productive seconds), lost steps (steps done before the fault and replayed after it).
Reported apart from the local run (bench/goodput.py); no peer runs here: the peer value is the fault-free run's
goodput (1.0).

Three configurations run in one invocation (on 3 nodes, so a spare can sit apart from the workers): "no spares"
(the baseline; the result's `value`), and "spares + memory checkpoints" (`replicas.spares: 1`,
`checkpoint.memoryEverySteps: 10`), the same faults, reported beside it (`runs.configs`) with the issue's goals:
goodput >= 0.90, a deleted pod <= 3.5 s and a lost node <= 7 s from the fault to the first step after, a drained
node <= 1 s of stall (medians) and 0 replayed steps (every drain); and "memory-every-step" (`memoryEverySteps: 1`,
node losses only, half the steps): a lost node replays at most 1 step.

The harness reads the event log incrementally and polls the API in-process (bench/cluster_bed.py): re-reading the
whole log and starting a kubectl per poll took a growing share of the 2 cores the job trains on (goodput 0.82
against 0.88-0.90 with the same operator and trainer).

    python -m bench.goodput_operator            # one fault per 60 s over ~6 min of training (~27 min: 3 configs)
    python -m bench.goodput_operator --quick    # one fault of each kind, every 4 s, 12 s of training
    python -m bench.goodput_operator --quick --configs spares-memory --kinds drain-node   # the harness, one drain
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException
from rich.console import Console
from rich.table import Table

from bench.cluster_bed import KUBECTL, Bed, wait
from bench.common import RESULTS, median, write_result
from bench.goodput_faults import agent_failure_times, analyse_faults, find_ranks
from flywheel.eventlog import EventTail, Record, Start, Step
from flywheel.local import procs

KINDS = ("kill-rank", "delete-pod", "lose-node", "drain-node")
# A cloud's maintenance notice (AWS Node Termination Handler, taintNode: true), one of the default drain taint keys.
DRAIN_TAINT = "aws-node-termination-handler/scheduled-maintenance"
REPLICAS, PROCS, CKPT_EVERY, NODE_FAILURE_GRACE_S = 2, 2, 50, 5
GOALS = {60.0: 0.85, 300.0: 0.95}  # the local run's goals (issue 8), shown for reference
NODES = 3  # two workers and a spare apart from them
# name -> (spares, checkpoint.memoryEverySteps)
# A memory copy every 10 steps: one every step takes this CPU-only model from 23 to 39 ms a step (a 12 MB copy, a
# /dev/shm write and a peer send per rank per step on 2 shared cores; reported as the configuration's pace cost);
# every 10 steps a fault replays at most 9 steps.
MEMORY_EVERY = 10
PLAIN = (0, 0)
CONFIGS = {"no-spares": PLAIN, "spares-memory": (1, MEMORY_EVERY), "memory-every-step": (1, 1)}
# The memory copy on every step is there for issue 19's "a node loss replays at most one step": its run loses nodes
# only, for half the training length; its goodput carries the per-step copy's cost and has no goal.
CONFIG_KINDS = {"memory-every-step": ("lose-node",)}
EVERY_STEP_REPLAYED_GOAL = 1
# issue 21, at one fault a minute: goodput; fault -> first step after (delete-pod, lose-node) and the drain's stall,
# medians in seconds; and the most steps any drain may replay.
SPARES_GOALS = {"goodput": 0.90, "delete-pod": 3.5, "lose-node": 7.0, "drain-node": 1.0}
DRAIN_REPLAYED_GOAL = 0


class ActionClock(threading.Thread):
    """Wall times of the operator's actions on a job: `status.restarts` growing, a worker pod replaced."""

    def __init__(self, bed: Bed, job: str) -> None:
        super().__init__(daemon=True)
        self.bed, self.job, self.times, self.halt = bed, job, [], threading.Event()

    def run(self) -> None:
        restarts, uids = 0, {}
        while not self.halt.wait(0.2):
            try:
                status = self.bed.job(self.job).get("status", {})
                pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in self.bed.pods(self.job)}
            except (OSError, ValueError, KeyError, ApiException):  # an API hiccup: the next poll
                continue
            now = time.time()
            replaced = any(name in uids and uids[name] != uid for name, uid in pods.items())
            if int(status.get("restarts", 0)) > restarts or replaced:
                self.times.append(now)
            restarts, uids = int(status.get("restarts", 0)), {**uids, **pods}


class LogWatch:
    """The job's event log as it grows, read incrementally: re-reading the whole log (13,000 steps in a full run)
    every 0.1 s took a growing share of the 2 cores the training runs on."""

    def __init__(self, path: Path) -> None:
        self.tail = EventTail(path)
        self.events: list[Record] = []
        self.last_start = self.last_step_time = 0.0
        self.last_step = 0

    def poll(self) -> None:
        for e in self.tail.read_new():
            self.events.append(e)
            if isinstance(e, Start):
                self.last_start = max(self.last_start, e.time)
            elif isinstance(e, Step):
                self.last_step_time, self.last_step = max(self.last_step_time, e.time), max(self.last_step, e.step)

    def first_step_time(self) -> float | None:
        self.poll()
        return next((e.time for e in self.events if isinstance(e, Step)), None)

    def training_since(self, t: float) -> bool:
        """The group was (re)started after `t` and has stepped since: recovered from a fault at `t`. A step logged
        just after a fault by the old group (in flight) does not count."""
        return self.last_start > t and self.last_step_time > self.last_start


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
    elif kind == "drain-node":
        fault["time"] = time.time()
        bed.kubectl("taint", "node", node, f"{DRAIN_TAINT}=true:NoSchedule")
    else:
        fault["time"] = time.time()
        bed.cluster.kubelet.lose_node(node)
    return fault


def undo(bed: Bed, fault: dict[str, Any]) -> None:
    """The faulted node comes back: a lost node is restored, a drained one untainted (the maintenance is over)."""
    if fault["kind"] == "lose-node":
        bed.cluster.kubelet.restore_node(fault["node"])
    elif fault["kind"] == "drain-node":
        bed.kubectl("taint", "node", fault["node"], f"{DRAIN_TAINT}-")


def pauses(rows: list[dict[str, Any]], events: list[Record]) -> list[dict[str, Any]]:
    """Each fault's stall: from the last step logged before its recovery's first step to that step (None when it
    did not recover). For a drain that is the checkpointed step's to the next one's: the steps between the taint
    and the checkpoint were trained once, and count as training."""
    times = sorted(e.time for e in events if isinstance(e, Step))
    out = []
    for r in rows:
        recovered = r.get("recovered_at")
        before = [t for t in times if recovered is not None and t < recovered]
        out.append({**r, "pause_s": recovered - before[-1] if recovered is not None and before else None})
    return out


def run_job(bed: Bed, name: str, steps: int, period_s: float | None, seed: int,
            max_faults: int = 1_000, spares: int = 0, memory_every: int = 0,
            kinds: tuple[str, ...] = KINDS) -> dict[str, Any]:
    bed.apply_job(name, steps=steps, checkpoint_every=CKPT_EVERY, node_failure_grace_s=NODE_FAILURE_GRACE_S,
                  replicas=REPLICAS, procs_per_replica=PROCS, max_restarts=100, spares=spares,
                  memory_every_steps=memory_every)
    clock = ActionClock(bed, name)
    clock.start()
    rng, fired, to_undo = random.Random(seed), [], []
    began = time.time()
    path = wait(f"{name}'s event log", lambda: bed.events_file(name), 300, interval=0.2)
    log = LogWatch(path)
    first: float = wait(f"{name}'s first step", log.first_step_time, 300, interval=0.1)
    deadline, phase_checked = time.time() + 60 * 60, 0.0
    while time.time() < deadline:
        if time.time() - phase_checked > 1.0:
            phase, phase_checked = bed.job(name).get("status", {}).get("phase"), time.time()
            if phase in ("Succeeded", "Failed"):
                break
        log.poll()
        recovered = log.training_since(fired[-1]["time"] if fired else 0.0)
        if to_undo and recovered:  # a dead or drained node comes back once the job trains without it
            undo(bed, to_undo.pop())
        due = period_s is not None and time.time() >= first + (len(fired) + 0.5) * period_s
        if due and recovered and log.last_step < steps - 20 and len(fired) < max_faults:
            fault = inject(bed, name, kinds[len(fired) % len(kinds)], rng)
            if fault is None:
                time.sleep(0.1)
                continue
            fault.update(planned_s=(len(fired) + 0.5) * period_s, step_at_fault=log.last_step)
            fired.append(fault)
            if fault["kind"] in ("lose-node", "drain-node"):
                to_undo.append(fault)
            print(f"  {name}: {fault['kind']} {fault['pod']} at step {log.last_step}", flush=True)
        time.sleep(0.1)
    for fault in to_undo:
        undo(bed, fault)
    clock.halt.set()
    clock.join(5)
    log.poll()
    events = log.events
    steps_ev = [e for e in events if isinstance(e, Step)]
    # A killed rank is handled by its worker's agent (a new round of the etcd rendezvous) without the operator:
    # its detection is the agent's failure line in the pod's log.
    pod_logs = sorted({*bed.workdir.glob(f"cluster/**/default_{name}-worker-*.log"),
                       *bed.workdir.glob(f"cluster/**/default_{name}-spare-*.log")})  # a promoted spare's too
    agent_failures = agent_failure_times(pod_logs)
    status = bed.job(name).get("status", {})
    phase = status.get("phase")
    return {"name": name, "phase": phase, "goodput_status": status.get("goodput"),
            "last_restore": status.get("lastRestore"), "steps": steps, "fired": fired, "first_step": first,
            "last_step_time": steps_ev[-1].time, "wall_s": steps_ev[-1].time - first,
            "e2e_s": steps_ev[-1].time - began,
            "operator_actions": clock.times, "agent_failures": agent_failures,
            "faults": pauses(analyse_faults(fired, events, agent_failures, clock.times), events) if fired else []}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--period", type=float, default=60.0, help="seconds between faults")
    parser.add_argument("--minutes", type=float, default=6.0, help="training length of the faulted run")
    parser.add_argument("--clean-steps", type=int, default=1500,
                        help="steps of the fault-free run whose pace is the baseline (300 varied it by ~10%%)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-faults", type=int, default=1_000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "goodput_operator.json")
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=list(CONFIGS),
                        help="which configurations to run (default: both, the baseline first)")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                        help="the fault kinds to rotate through (default: all; a subset checks the harness)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the test bed's files (operator log, pod logs, event logs) in this folder")
    args = parser.parse_args()
    kinds = tuple(args.kinds)
    if args.quick:
        # Each fault fires once the job trains again after the previous one: one of each kind, back to back.
        args.period, args.minutes, args.clean_steps, args.max_faults = 4.0, 0.2, 40, len(kinds)
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
            cleans = clean_runs(bed, args.configs, args.clean_steps, args.seed)
            clean, step_s = cleans[PLAIN]["run"], cleans[PLAIN]["step_s"]
            steps = max(100, int(args.minutes * 60 / step_s))
            print(f"clean: {step_s * 1000:.1f} ms/step; faulted runs: {steps} steps", flush=True)
            runs = {config: run_job(bed, f"faults-{config}", config_steps(config, steps), args.period, args.seed,
                                    args.max_faults, *CONFIGS[config], kinds=config_kinds(config, kinds))
                    for config in args.configs}
        finally:
            bed.close()
    configs = {config: summarize(run, cleans[CONFIGS[config]]["step_s"], args.period, config_kinds(config, kinds),
                                 plain_step_s=step_s) for config, run in runs.items()}
    baseline = configs.get("no-spares") or next(iter(configs.values()))
    goal = GOALS.get(args.period)
    passed = all(c["phase"] == "Succeeded" for c in configs.values()) and (goal is None or baseline["goodput"] >= goal)
    spares = configs.get("spares-memory")
    spares_pass = spares is not None and spares["phase"] == "Succeeded" and spares_met(spares)
    write_result("goodput_operator", path=args.out, metric=f"goodput, one pod-level fault per {args.period:g} s",
                 value=baseline["goodput"], unit="ratio", peer="fault-free run, same job", peer_value=1.0,
                 goal=f">= {goal} and Succeeded" if goal else "Succeeded (no goal at this fault rate)",
                 passed=passed, runs={"clean": clean, "faulted": runs.get("no-spares"), "clean_step_s": step_s,
                                      "clean_step_s_by_config": {c: cleans[CONFIGS[c]]["step_s"] for c in configs},
                                      "by_kind": baseline["by_kind"], "configs": configs,
                                      "faulted_runs": runs},
                 quick=args.quick, period_s=args.period, kinds=list(kinds), spares_goal=spares_goal(),
                 spares_pass=spares_pass, rows=([spares_row(spares)] if spares is not None else [])
                 + ([every_step_row(configs["memory-every-step"])] if "memory-every-step" in configs else []))
    for config, c in configs.items():
        print(f"{config}: goodput {c['goodput']:.3f} over {c['wall_s']:.0f} s with {c['faults']} faults, "
              f"{c['phase']}")
    print(f"{'PASS' if passed else 'FAIL'} (baseline); spares goals {'met' if spares_pass else 'not met'} "
          f"-> {args.out}")
    return 0


def clean_runs(bed: Bed, configs: list[str], steps: int, seed: int) -> dict[tuple[int, int], dict[str, Any]]:
    """The fault-free run of each configuration's job (by (spares, memoryEverySteps)), the plain job's always: each
    faulted run is measured against its own, as the local goodput is (bench/goodput.py)."""
    out = {}
    for spec in dict.fromkeys([PLAIN, *(CONFIGS[c] for c in configs)]):
        name = "clean" if spec == PLAIN else f"clean-s{spec[0]}-m{spec[1]}"
        run = run_job(bed, name, steps, None, seed, 0, *spec)
        out[spec] = {"run": run, "step_s": run["wall_s"] / (steps - 1)}
        print(f"{name}: {out[spec]['step_s'] * 1000:.1f} ms/step", flush=True)
    return out


def summarize(run: dict[str, Any], step_s: float, period_s: float, kinds: tuple[str, ...] = KINDS,
              plain_step_s: float | None = None) -> dict[str, Any]:
    """One configuration's goodput against its own fault-free pace (`step_s`), its per-fault table and the per-kind
    medians (None for a kind that never fired or never recovered), with the most steps a fault of the kind
    replayed. `plain_step_s`: the plain job's pace, for what the configuration costs without faults (its spare and
    memory copies on the same cores) and its goodput against the plain job."""
    goodput = run["steps"] * step_s / run["wall_s"]
    plain = plain_step_s or step_s
    rows = run["faults"]
    table = Table(title=f"{run['name']}: goodput {goodput:.3f} (one fault / {period_s:g} s)")
    for column in ("fault", "pod", "step", "detect s", "restart s", "stall s", "lost steps"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(r["kind"], r["pod"], str(r["step_at_fault"]),
                      *(f"{r[k]:.1f}" if r.get(k) is not None else "-" for k in ("detect_s", "restart_s", "pause_s")),
                      str(r["lost_steps"]))
    Console().print(table)
    by_kind = {k: kind_figures([r for r in rows if r["kind"] == k]) for k in kinds}
    return {"goodput": goodput, "phase": run["phase"], "wall_s": run["wall_s"], "faults": len(rows),
            "clean_step_s": step_s, "pace_cost": step_s / plain - 1,
            "goodput_vs_plain": run["steps"] * plain / run["wall_s"],
            "by_kind": by_kind, "last_recovery": (run.get("goodput_status") or {}).get("lastRecovery"),
            "badput_seconds": (run.get("goodput_status") or {}).get("badputSeconds"),
            "last_restore": run.get("last_restore")}


def kind_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The medians of one kind's faults (None where none has the figure), and the most steps one replayed."""
    def med(key: str) -> float | None:
        values = [r[key] for r in rows if r.get(key) is not None]
        return median(values) if values else None

    lost = [r["lost_steps"] for r in rows if r.get("lost_steps") is not None]
    return {"detect_s": med("detect_s"), "restart_s": med("restart_s"), "stall_s": med("pause_s"),
            "lost_steps": med("lost_steps"), "max_lost_steps": max(lost) if lost else None, "faults": len(rows)}


def spares_goal(what: str = "goodput ") -> str:
    """The spares configuration's goals in words (`what`: how the goodput goal is named)."""
    return (f"{what}>= {SPARES_GOALS['goodput']}, delete-pod <= {SPARES_GOALS['delete-pod']} s, lose-node <= "
            f"{SPARES_GOALS['lose-node']} s (fault -> first step after), drain-node stall <= "
            f"{SPARES_GOALS['drain-node']} s (medians) and {DRAIN_REPLAYED_GOAL} replayed steps")


def spares_row(config: dict[str, Any]) -> dict[str, Any]:
    """The spares configuration's row of the report: its goodput beside the baseline's run, with the issue's goals."""
    by_kind = config["by_kind"]
    parts = [", ".join(f"{kind} {by_kind[kind]['restart_s']:.1f} s" for kind in KINDS
                       if kind != "drain-node" and (by_kind.get(kind) or {}).get("restart_s") is not None)]
    drain = by_kind.get("drain-node") or {}
    if drain.get("stall_s") is not None:
        parts.append(f"drain-node stall {drain['stall_s']:.1f} s, at most {drain['max_lost_steps']} steps replayed")
    parts_text = "; ".join(p for p in parts if p)
    # Against its own fault-free run; what the spare and the copies cost a fault-free run on these shared cores,
    # and the goodput against the plain job, are given beside it.
    cost = (f"; without faults this configuration trains {config['pace_cost']:+.0%} slower than the plain job, "
            f"goodput against the plain job {config['goodput_vs_plain']:.3f}") if "pace_cost" in config else ""
    return {"name": "spares + memory checkpoints",
            "metric": f"goodput with replicas.spares 1 and checkpoint.memoryEverySteps {MEMORY_EVERY}, against its "
                      "own fault-free run (fault -> first step after, "
                      f"medians: {parts_text}{cost})",
            "value": config["goodput"], "unit": "ratio", "peer": "goal", "peer_value": SPARES_GOALS["goodput"],
            "ratio": config["goodput"] / SPARES_GOALS["goodput"],
            "goal": f"{spares_goal(what='')}, Succeeded",
            "pass": config["phase"] == "Succeeded" and spares_met(config)}


def config_kinds(config: str, kinds: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(k for k in CONFIG_KINDS.get(config, kinds) if k in kinds) or kinds


def config_steps(config: str, steps: int) -> int:
    return max(100, steps // 2) if config in CONFIG_KINDS else steps


def every_step_row(config: dict[str, Any]) -> dict[str, Any]:
    """The memory-every-step configuration's row: the most steps a node loss replayed."""
    lost = (config["by_kind"].get("lose-node") or {})
    most = lost.get("max_lost_steps")
    return {"name": "node loss, memory copy every step",
            "metric": f"most steps a lost node replayed with replicas.spares 1 and checkpoint.memoryEverySteps 1 "
                      f"({lost.get('faults', 0)} node losses; goodput {config['goodput']:.3f} against its own "
                      f"fault-free run, which the per-step copies make {config.get('pace_cost', 0):+.0%} slower than "
                      f"the plain job's; restart median {lost.get('restart_s') or 0:.1f} s)",
            "value": most, "unit": "steps", "peer": "goal", "peer_value": EVERY_STEP_REPLAYED_GOAL,
            "ratio": None, "goal": f"<= {EVERY_STEP_REPLAYED_GOAL} replayed step, Succeeded",
            "pass": config["phase"] == "Succeeded" and most is not None and most <= EVERY_STEP_REPLAYED_GOAL}


def spares_met(config: dict[str, Any]) -> bool:
    """Every goal of the spares configuration; a kind without a measured recovery misses its goal."""
    by_kind = config["by_kind"]

    def within(kind: str, figure: str) -> bool:
        value = (by_kind.get(kind) or {}).get(figure)
        return value is not None and value <= SPARES_GOALS[kind]

    drain = by_kind.get("drain-node") or {}
    drained = within("drain-node", "stall_s") and drain.get("max_lost_steps") is not None and \
        drain["max_lost_steps"] <= DRAIN_REPLAYED_GOAL
    return (config["goodput"] >= SPARES_GOALS["goodput"] and within("delete-pod", "restart_s")
            and within("lose-node", "restart_s") and drained)


if __name__ == "__main__":
    sys.exit(main())
