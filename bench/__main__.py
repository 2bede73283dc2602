"""Runs every benchmark and writes bench/results/REPORT.md from their JSON results.

    python -m bench            # full runs, one at a time (tens of minutes)
    python -m bench --quick    # the quick mode of each, in two lanes (~9 minutes on 2 cores)
    python -m bench --only checkpoint_stall --quick
    python -m bench --report-only  # REPORT.md and the README table from the results already there

The quick run's cluster lane (test cluster, operator, Prometheus) spends most of its time waiting on timeouts that
the benchmarks measure (lease expiry, node grace, gloo timeouts, torchrun's 30 s stop wait), so it runs beside
the CPU lane: each benchmark still compares ours with a peer measured in the same run, but under the other lane's
load. Full runs are never concurrent; judge the numbers by them. Each benchmark's output goes to
RESULTS/logs/<name>.log when lanes run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.common import RESULTS
from bench.report import update_readme, write_report

ROOT = Path(__file__).resolve().parent.parent
# Ordered so that the cluster lane's waits (hang_recovery, dead_worker) meet the CPU lane's heaviest (goodput,
# goodput_user_script), and its heaviest (goodput_operator, ~310 s of quick runs) the CPU lane's lightest. The two
# compile benchmarks at the CPU lane's end even the lanes out (quick, 2026-12-04: 531 s and 534 s; 665 s and 434 s
# before the CPU lane took them).
CPU_LANE = ("restart_latency", "parallel_parity", "trainer_overhead", "planner_accuracy", "goodput",
            "goodput_user_script", "checkpoint_restore", "torchtitan_peer", "compile_graph_breaks", "loss_memory")
CLUSTER_LANE = ("goodput_operator", "hang_recovery", "dead_worker", "operator_scale", "api_latency", "checkpoint_stall")
BENCHMARKS = ("checkpoint_stall", "restart_latency", "trainer_overhead", "parallel_parity", "planner_accuracy",
              "hang_recovery", "api_latency", "operator_scale",
              "dead_worker", "goodput", "goodput_user_script", "goodput_operator", "checkpoint_restore",
              "torchtitan_peer", "compile_graph_breaks", "loss_memory")
assert sorted(CPU_LANE + CLUSTER_LANE) == sorted(BENCHMARKS)


_PRINT = threading.Lock()


def say(line: str) -> None:
    with _PRINT:  # lanes print from two threads
        print(line, flush=True)


def run_one(name: str, quick: bool, log: Path | None, failed: list[str]) -> None:
    began = time.monotonic()
    say(f"== {name}{' (quick)' if quick else ''}")
    argv = [sys.executable, "-m", f"bench.{name}", *(["--quick"] if quick else [])]
    env = dict(os.environ, FLYWHEEL_BENCH_LANES="1") if log else None
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as out:
            code = subprocess.call(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    else:
        code = subprocess.call(argv, cwd=ROOT)
    say(f"== {name}: exit {code}, {time.monotonic() - began:.0f} s{f' (log: {log})' if log else ''}")
    if code:
        failed.append(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", action="append", choices=BENCHMARKS)
    parser.add_argument("--one-lane", action="store_true", help="quick runs too one benchmark at a time")
    parser.add_argument("--report-only", action="store_true", help="run nothing; rewrite the report and table")
    args = parser.parse_args(argv)
    chosen = () if args.report_only else args.only or BENCHMARKS
    failed: list[str] = []
    began = time.monotonic()
    if args.quick and not args.one_lane and len(chosen) > 1:
        lanes = [[n for n in lane if n in chosen] for lane in (CPU_LANE, CLUSTER_LANE)]
        threads = [threading.Thread(target=lambda lane=lane: [run_one(n, True, RESULTS / "logs" / f"{n}.log", failed)
                                                              for n in lane]) for lane in lanes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for name in chosen:
            run_one(name, args.quick, None, failed)
    if chosen:
        print(f"== all: {time.monotonic() - began:.0f} s, failed: {', '.join(failed) or 'none'}", flush=True)
    print(f"report: {write_report(BENCHMARKS)}")
    if RESULTS == ROOT / "bench" / "results" and update_readme(BENCHMARKS):  # not for results kept elsewhere
        print("README.md: Performance table updated")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
