"""Runs every benchmark and writes bench/results/REPORT.md from their JSON results.

    python -m bench            # full runs (tens of minutes)
    python -m bench --quick    # the quick mode of each (a few minutes)
    python -m bench --only checkpoint_stall --quick
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.common import RESULTS

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ("checkpoint_stall", "restart_latency", "trainer_overhead", "parallel_parity", "planner_accuracy",
              "hang_recovery", "api_latency")


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def write_report(names: tuple[str, ...] = BENCHMARKS) -> Path:
    rows = ["| benchmark | metric | ours | peer | peer value | ratio | goal | pass | mode |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        path = RESULTS / f"{name}.json"
        if not path.exists():
            rows.append(f"| {name} | (not run) | | | | | | | |")
            continue
        r = json.loads(path.read_text())
        rows.append(f"| {name} | {r['metric']} | {_fmt(r['value'])} {r.get('unit', '')} | {r['peer']} | "
                    f"{_fmt(r['peer_value'])} | {_fmt(r['ratio'])} | {r['goal']} | {'yes' if r['pass'] else 'NO'} | "
                    f"{'quick' if r.get('quick') else 'full'} |")
    report = RESULTS / "REPORT.md"
    report.write_text("# Benchmark report\n\nEach ratio is ours / the peer measured in the same run "
                      "(`python -m bench [--quick]` regenerates this file).\n\n" + "\n".join(rows) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", action="append", choices=BENCHMARKS)
    args = parser.parse_args(argv)
    failed = []
    for name in args.only or BENCHMARKS:
        began = time.monotonic()
        print(f"== {name}{' (quick)' if args.quick else ''}", flush=True)
        code = subprocess.call([sys.executable, "-m", f"bench.{name}", *(["--quick"] if args.quick else [])],
                               cwd=ROOT)
        print(f"== {name}: exit {code}, {time.monotonic() - began:.0f} s", flush=True)
        if code:
            failed.append(name)
    print(f"report: {write_report()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
