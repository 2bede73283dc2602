"""Restart latency: a rank is SIGKILLed -> the first training step after the restart.

Ours: `flywheel launch` (our rendezvous settings; the c10d store hosted outside the worker, as `flywheel run`
does). Peer: `torchrun --max-restarts 3` with default settings, on the same minimal training script
(examples/scripts/restart_probe.py), 1 worker x 2 ranks. Two topologies: elastic (nnodes 1:2, where torch's
30 s last-call wait applies; the headline) and fixed size (nnodes 1). "Extra restarts" counts restarts beyond the
one the kill needs (e.g. a group that re-forms twice because of stale addresses).

    python bench/restart_latency.py           # elastic: 20 trials of ours, 2 of torchrun (~60 s each, its
                                              # first rendezvous waits 30 s too); fixed: 5 each (~5 min)
    python bench/restart_latency.py --quick   # fixed size only, 1 trial each (~20 s; the headline is then the
                                              # fixed-size topology: torch's 30 s last-call waits need minutes)

A trial that does not recover within --trial-timeout counts as that timeout (torchrun as typed sometimes never
re-forms its group after the kill: pytorch#135712), so a median with such trials in it is a lower bound ("censored"
in the stats); a peer that never recovered still gives a ratio, never a missing one.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch.distributed as dist
from rich.console import Console
from rich.table import Table

from bench.common import RESULTS, run_session, write_result

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "examples" / "scripts" / "restart_probe.py"
RESULT = RESULTS / "restart_latency.json"
GOAL_S = 2.0  # median seconds from a rank kill to the first step after
TRIAL_TIMEOUT_S = 150
TOPOLOGIES = {"elastic": "1:2", "fixed": "1"}


@dataclass(frozen=True)
class Trial:
    launcher: str
    topology: str
    latency_s: float | None  # None: the trial did not recover within the timeout
    extra_restarts: int
    exit_code: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parse_probe_log(path: Path) -> tuple[float | None, int]:
    """(kill -> first step after the restart, restarts beyond the first) from the probe's log."""
    kill_time, first_after, max_restart = None, None, 0
    for line in path.read_text().splitlines() if path.exists() else ():
        parts = line.split()
        if parts[0] == "kill":
            kill_time = float(parts[1])
        elif parts[0] == "step":
            restart = int(parts[3])
            max_restart = max(max_restart, restart)
            if restart >= 1 and first_after is None:
                first_after = float(parts[2])
    if kill_time is None or first_after is None:
        return None, max(max_restart - 1, 0)
    return first_after - kill_time, max(max_restart - 1, 0)


def run_trial(launcher: str, topology: str, index: int, store_endpoint: str, workdir: Path,
              timeout_s: float = TRIAL_TIMEOUT_S) -> Trial:
    log = workdir / f"{launcher}-{topology}-{index}.log"
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"}
    env.update(OMP_NUM_THREADS="1", PROBE_LOG=str(log), PROBE_STEPS="10", PROBE_KILL_STEP="5", PROBE_KILL_RANK="1")
    nnodes = TOPOLOGIES[topology]
    run_id = f"{launcher}-{topology}-{index}-{os.getpid()}"
    if launcher == "flywheel":
        env.update(PET_NNODES=nnodes, PET_NPROC_PER_NODE="2", PET_RDZV_BACKEND="c10d", PET_RDZV_ENDPOINT=store_endpoint,
                   PET_RDZV_ID=run_id, PET_MAX_RESTARTS="3")
        argv = [sys.executable, "-m", "flywheel.cli", "launch", "--", str(PROBE)]
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", nnodes, "--nproc-per-node", "2",
                "--max-restarts", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
                "--rdzv-id", run_id, str(PROBE)]
    code = run_session(argv, env, REPO, timeout_s)
    code = -1 if code is None else code
    latency, extra = _parse_probe_log(log)
    return Trial(launcher, topology, latency, extra, code)


def _stats(trials: list[Trial], timeout_s: float) -> dict[str, float | int | None]:
    """Unrecovered trials count as the timeout: the median and p90 are then lower bounds (`censored` > 0)."""
    latencies = sorted(timeout_s if t.latency_s is None else t.latency_s for t in trials)
    recovered = sum(t.latency_s is not None for t in trials)
    p90 = latencies[min(len(latencies) - 1, int(round(0.9 * (len(latencies) - 1))))] if latencies else None
    return {"trials": len(trials), "recovered": recovered, "censored": len(trials) - recovered,
            "median_s": statistics.median(latencies) if latencies else None, "p90_s": p90,
            "extra_restarts": sum(t.extra_restarts for t in trials),
            "failed_runs": sum(t.exit_code != 0 for t in trials)}


def _fmt(v: float | int | None) -> str:
    return "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20, help="elastic trials of ours (the headline)")
    parser.add_argument("--peer-trials", type=int, default=2, help="elastic trials of torchrun (~60 s each)")
    parser.add_argument("--fixed-trials", type=int, default=5, help="fixed-size trials of each launcher")
    parser.add_argument("--quick", action="store_true", help="fixed size only, 1 trial of each")
    parser.add_argument("--trial-timeout", type=float,
                        help=f"seconds before a trial counts as not recovered (its latency = this, a lower bound; "
                             f"default {TRIAL_TIMEOUT_S}, quick 30)")
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args()
    counts = {"elastic": {"flywheel": args.trials, "torchrun": args.peer_trials},
              "fixed": {"flywheel": args.fixed_trials, "torchrun": args.fixed_trials}}
    if args.quick:
        counts = {"elastic": {"flywheel": 0, "torchrun": 0}, "fixed": {"flywheel": 1, "torchrun": 1}}
    args.trial_timeout = args.trial_timeout or (30.0 if args.quick else TRIAL_TIMEOUT_S)
    console = Console()
    if not console.is_terminal:
        console = Console(width=120)  # keep the table readable in logs
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    endpoint = f"127.0.0.1:{store.port}"
    results: dict[str, dict[str, list[Trial]]] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="restart-latency-") as tmp:
        for topology in TOPOLOGIES:
            for launcher, n in counts[topology].items():
                runs = []
                for i in range(n):
                    runs.append(run_trial(launcher, topology, i, endpoint, Path(tmp), args.trial_timeout))
                    console.print(f"{topology:8} {launcher:9} trial {i + 1}/{n}: "
                                  f"{_fmt(runs[-1].latency_s)} s, extra restarts {runs[-1].extra_restarts}",
                                  highlight=False)
                results.setdefault(topology, {})[launcher] = runs
    del store
    stats = {topo: {launcher: _stats(runs, args.trial_timeout) for launcher, runs in by.items() if runs}
             for topo, by in results.items()}
    stats = {topo: by for topo, by in stats.items() if by}
    table = Table(title="restart latency: rank SIGKILLed -> first step after restart (1 worker x 2 ranks)")
    for column in ("topology", "launcher", "recovered", "median s", "p90 s", "extra restarts", "failed runs"):
        table.add_column(column)
    for topo, by in stats.items():
        for launcher, s in by.items():
            bound = ">= " if s["censored"] else ""
            table.add_row(f"{topo} (nnodes {TOPOLOGIES[topo]})", launcher, f"{s['recovered']}/{s['trials']}",
                          bound + _fmt(s["median_s"]), bound + _fmt(s["p90_s"]), _fmt(s["extra_restarts"]),
                          _fmt(s["failed_runs"]))
    console.print(table)

    headline = "elastic" if "elastic" in stats else "fixed"
    head, peer = stats[headline]["flywheel"], stats[headline]["torchrun"]
    value, peer_value = head["median_s"], peer["median_s"]
    passed = bool(value is not None and value <= GOAL_S and head["extra_restarts"] == 0
                  and head["recovered"] == head["trials"])
    ratio = value / peer_value if value and peer_value else None
    write_result("restart_latency", path=args.out,
                 metric="restart latency, median (rank SIGKILLed -> first step after restart), "
                        f"{headline} nnodes {TOPOLOGIES[headline]}",
                 value=value, unit="s", peer="torchrun --max-restarts 3, default settings", peer_value=peer_value,
                 goal=f"median <= {GOAL_S:g} s, no extra restarts", passed=passed, stats=stats,
                 peer_lower_bound=bool(peer["censored"]), trial_timeout_s=args.trial_timeout, quick=args.quick,
                 runs={topo: {launcher: [asdict(t) for t in runs] for launcher, runs in by.items()}
                       for topo, by in results.items()},
                 load_average_1m=os.getloadavg()[0], bench_seconds=time.monotonic() - started)
    bound = ">= " if peer["censored"] else ""
    console.print(f"{headline}: ours {_fmt(value)} s vs torchrun {bound}{_fmt(peer_value)} s "
                  f"(ratio {_fmt(ratio)}); goal median <= {GOAL_S} s: {'PASS' if passed else 'FAIL'} -> {args.out}",
                  highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
