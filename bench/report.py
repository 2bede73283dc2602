"""bench/results/REPORT.md: one table row and one plot (PNG) per benchmark, from the JSON results.

Each plot sets our value beside the peer's, measured in the same run, with the goal and the verdict in the title,
so a reader sees the size of a ratio rather than only its digits.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on CI machines
import matplotlib.pyplot as plt

from bench.common import RESULTS


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def plot(name: str, record: dict[str, Any], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7.2, 3.4), dpi=100)
    values = [float(record["value"] or 0.0), float(record["peer_value"] or 0.0)]  # None: nothing measured
    peer_label = textwrap.fill(str(record["peer"]), 28, max_lines=3, placeholder=" ...")
    bars = ax.barh(["ours", peer_label], values,
                   color=["#2a9d8f" if record["pass"] else "#e76f51", "#8d99ae"])
    ax.bar_label(bars, labels=[f"{v:.4g} {record.get('unit', '')}" for v in values], padding=3, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(values) * 1.35 or 1)
    ax.set_xlabel(textwrap.shorten(f"{record['metric']} ({record.get('unit', '')})", 100, placeholder=" ..."),
                  fontsize=8)
    verdict = "pass" if record["pass"] else "FAIL (quick: not judged)" if record.get("quick") else "FAIL"
    goal = textwrap.shorten(f"goal: {record['goal']}", 90, placeholder=" ...")
    ax.set_title(f"{name}: ratio {_fmt(record['ratio'])} -> {verdict}\n{goal}", fontsize=9)
    ax.tick_params(labelsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


README = Path(__file__).resolve().parents[1] / "README.md"
README_BEGIN, README_END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"


def _verdict(record: dict) -> str:
    # A quick run shortens the runs and timeouts the goals are stated for and may share the cores with the other
    # lane: its failures are shown, but only a full run judges the goal.
    if record["pass"] is None:  # a figure shown for what it explains, with no goal of its own
        return "-"
    if record["pass"]:
        return "yes"
    return "NO (quick: not judged)" if record.get("quick") else "NO"


def table(names: tuple[str, ...], results: Path = RESULTS) -> list[str]:
    """The results as markdown table rows, one per benchmark."""
    rows = ["| benchmark | metric | ours | peer | peer value | ratio | goal | pass | mode |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        path = results / f"{name}.json"
        if not path.exists():
            rows.append(f"| {name} | (not run) | | | | | | | |")
            continue
        r = json.loads(path.read_text())
        mode = f"{'quick' if r.get('quick') else 'full'}{' (lanes)' if r.get('concurrent_lanes') else ''}"
        # A benchmark with several figures keeps its headline in the record and the others in `rows`, each
        # with its own peer (or its goal as the peer) and verdict.
        for label, row in [(name, r)] + [(f"{name}: {sub['name']}", sub) for sub in r.get("rows", [])]:
            rows.append(f"| {label} | {row['metric']} | {_fmt(row['value'])} {row.get('unit', '')} | "
                        f"{row['peer']} | {_fmt(row['peer_value'])} | {_fmt(row['ratio'])} | {row['goal']} | "
                        f"{_verdict({**row, 'quick': r.get('quick')})} | {mode} |")
    return rows


def write_report(names: tuple[str, ...], results: Path = RESULTS) -> Path:
    plots = []
    for name in names:
        path = results / f"{name}.json"
        if path.exists():
            png = plot(name, json.loads(path.read_text()), results / f"{name}.png")
            plots.append(f"### {name}\n\n![{name}]({png.name})\n")
    report = results / "REPORT.md"
    report.write_text("# Benchmark report\n\nEach ratio is ours / the peer measured in the same run "
                      "(`python -m bench [--quick]` regenerates this file).\n\n" + "\n".join(table(names, results))
                      + "\n\n## Plots\n\n" + "\n".join(plots))
    return report


def update_readme(names: tuple[str, ...], results: Path = RESULTS, readme: Path = README) -> bool:
    """Put the table between the README's bench-table markers (its Performance section); False if it has none."""
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        return False
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    readme.write_text(head + README_BEGIN + "\n" + "\n".join(table(names, results)) + "\n" + README_END + tail)
    return True
