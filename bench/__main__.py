"""Runs every benchmark and writes bench/results/REPORT.md from their JSON results.

    python -m bench            # full runs (tens of minutes)
    python -m bench --quick    # the quick mode of each (a few minutes)
    python -m bench --only checkpoint_stall --quick
    python -m bench --report-only  # REPORT.md and the README table from the results already there
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from bench.common import RESULTS
from bench.report import update_readme, write_report

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ("checkpoint_stall", "restart_latency", "trainer_overhead", "parallel_parity", "planner_accuracy",
              "hang_recovery", "api_latency", "operator_scale",
              "dead_worker", "goodput", "goodput_operator")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", action="append", choices=BENCHMARKS)
    parser.add_argument("--report-only", action="store_true", help="run nothing; rewrite the report and table")
    args = parser.parse_args(argv)
    failed = []
    for name in () if args.report_only else args.only or BENCHMARKS:
        began = time.monotonic()
        print(f"== {name}{' (quick)' if args.quick else ''}", flush=True)
        code = subprocess.call([sys.executable, "-m", f"bench.{name}", *(["--quick"] if args.quick else [])],
                               cwd=ROOT)
        print(f"== {name}: exit {code}, {time.monotonic() - began:.0f} s", flush=True)
        if code:
            failed.append(name)
    print(f"report: {write_report(BENCHMARKS)}")
    if RESULTS == ROOT / "bench" / "results" and update_readme(BENCHMARKS):  # not for results kept elsewhere
        print("README.md: Performance table updated")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
