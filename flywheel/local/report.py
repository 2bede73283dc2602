"""End-of-run report: summary.json, loss.png, timeline.png, and a rich table of failures and recoveries."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flywheel.eventlog import STEPS_NOT_REPORTED
from flywheel.local.run_record import RunRecord


def _pyplot() -> ModuleType:
    """matplotlib's pyplot, imported when the run ends (~0.3 s of CPU `flywheel run` need not spend before its
    workers start)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def write_summary(out_dir: Path, summary: dict[str, Any]) -> Path:
    path = out_dir / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path


def plot_loss(out_dir: Path, summary: dict[str, Any]) -> Path:
    points = [(i + 1, v) for i, v in enumerate(summary["losses"]) if v is not None]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    if points:
        ax.plot(*zip(*points), marker=".", linewidth=1, label="train")
    evals = [(e["step"], e["loss"]) for e in summary.get("evals", []) if e["loss"] is not None]
    if evals:
        ax.plot(*zip(*evals), marker="o", linewidth=1.5, label="eval")
        ax.legend()
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"{summary['job']}: loss ({summary['status']})")
    ax.grid(alpha=0.3)
    path = out_dir / "loss.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_timeline(out_dir: Path, record: RunRecord, summary: dict[str, Any], start_time: float) -> Path:
    """Step vs wall time, every attempt (replayed steps show as a drop), with failures/restarts/checkpoints."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    log = record.log
    if log.attempts:
        ax.plot([s.time - start_time for s in log.attempts], [s.step for s in log.attempts],
                ".", markersize=3, label="step")
    for i, f in enumerate(log.failures):
        ax.axvline(f.record.time - start_time, color="red", linestyle="--", linewidth=1,
                   label="failure" if i == 0 else None)
    for i, s in enumerate(log.starts[1:]):
        ax.axvline(s.time - start_time, color="green", linewidth=1, label="restart" if i == 0 else None)
    if log.checkpoints:
        ax.plot([c.time - start_time for c in log.checkpoints], [c.step for c in log.checkpoints], "s",
                color="orange", markersize=5, label="checkpoint committed")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("step")
    ax.set_title(f"{summary['job']}: {summary['restarts']} restarts, goodput {_goodput(summary, '.0%')}")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right")
    path = out_dir / "timeline.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _goodput(summary: dict[str, Any], spec: str) -> str:
    goodput = summary["goodput"]
    return "unknown (steps not reported)" if goodput is None else format(goodput, spec)


def _seconds(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} s"


def _eval_row(summary: dict[str, Any]) -> str:
    loss = summary["final_eval_loss"]
    shown = "-" if loss is None else f"{loss:.4f} (perplexity {math.exp(min(loss, 700.0)):.4g})"
    return f"{shown} at step {summary['final_eval_step']}"


def print_summary(console: Console, summary: dict[str, Any], out_dir: Path) -> None:
    colour = {"Succeeded": "green", "Failed": "red"}.get(summary["status"], "yellow")
    table = Table(title=f"{summary['job']}: [{colour}]{summary['status']}[/]", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    final_loss = summary["final_loss"]
    rows = [
        ("steps", str(summary["steps_completed"]) if summary.get("steps_reported", True) else
         escape(STEPS_NOT_REPORTED)),
        ("world size", str(summary["world_size"])),
        ("final loss", "-" if final_loss is None else f"{final_loss:.4f}"),
        *([("eval loss", _eval_row(summary))] if summary.get("final_eval_step") is not None else []),
        ("restarts", f"{summary['restarts']} (agent {summary['agent_restarts']}, "
                     f"worker recreations {len(summary['worker_recreations'])}{_from_spares(summary)})"),
        ("failures", str(len(summary["failures"]))),
        ("mean time to recover", _seconds(summary["mean_time_to_recover_seconds"])),
        ("lost steps (replayed)", str(summary["lost_steps"])),
        ("checkpoints", str(len(summary["checkpoints"])) +
         (f" ({summary['checkpoint_failures']} failed)" if summary["checkpoint_failures"] else "")),
        *[("checkpoint failed", escape(r["message"]) + (f" ({r['count']} saves)" if r["count"] > 1 else ""))
          for r in summary.get("checkpoint_failure_reports", [])],
        *[("checkpoint damaged", escape(b.get("words") or f"step {b['step']}: {b['reason']}; kept as {b['path']}"))
          for b in summary.get("bad_checkpoints", [])],
        ("goodput", f"{_goodput(summary, '.1%')} of {summary['wall_seconds']:.1f} s"),
        *([("reason", escape(summary["failure_reason"]))] if summary.get("failure_reason") else []),
        ("params sha256", (summary["final_params_sha256"] or "-")[:16]),
        ("output", str(out_dir)),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if summary["failures"]:
        failures = Table(title="failures and recoveries")
        for column in ("t", "rank", "worker", "kind", "detail", "recovered after", "restored from"):
            failures.add_column(column)
        for f in summary["failures"]:
            failures.add_row(f"{f['time']:.1f} s", "-" if f["rank"] is None else str(f["rank"]),
                             "-" if f["replica"] is None else str(f["replica"]), escape(f["kind"]),
                             escape(f["detail"]),
                             _seconds(f["recovered_seconds"]) if f["recovered_seconds"] is not None else
                             "not recovered", _restored_from(f))
        console.print(failures)


def _restored_from(failure: dict[str, Any]) -> str:
    restored = failure.get("restored_from")  # none: not recovered, a fresh start, or a user script's run
    return f"step {restored['step']} ({restored['source']})" if restored else "-"


def write_report(out_dir: Path, record: RunRecord, summary: dict[str, Any], start_time: float) -> None:
    write_summary(out_dir, summary)
    plot_loss(out_dir, summary)
    plot_timeline(out_dir, record, summary, start_time)


def _from_spares(summary: dict[str, Any]) -> str:
    promoted = sum(1 for r in summary["worker_recreations"] if r.get("spare"))
    return f", {promoted} by warm spares" if promoted else ""
