"""bench/goodput_operator's pure parts: a drained node's stall and replayed steps from the event log, the per-kind
figures, and the spares configuration's goals with the drain among them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.goodput_faults import analyse_faults, read_events
from bench.goodput_operator import (
    KINDS,
    config_kinds,
    config_steps,
    every_step_row,
    kind_figures,
    pauses,
    spares_met,
    spares_row,
)
from tests.eventlog.test_fold import T0, start, step


def _events(tmp_path: Path, raw: list[dict]) -> list:
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in raw))
    return read_events(path)


def test_a_drain_is_charged_the_gap_in_training_not_the_steps_trained_after_the_taint(tmp_path: Path) -> None:
    """Steps 1-5; the node tainted at 5.5; the group trains on to its checkpoint at step 7 (the answers) and stops;
    the new group starts at 7.8 from step 7 and trains 8 at 8.2 and 9 at 9.2."""
    events = _events(tmp_path, [start(0)] + [step(n, n) for n in range(1, 8)]
                     + [start(7.8, resumed_from=7, restart_count=1), step(8, 8.2), step(9, 9.2)])
    (row,) = pauses(analyse_faults([{"kind": "drain-node", "time": T0 + 5.5}], events, []), events)
    assert row["restart_s"] == pytest.approx(2.7)  # the taint -> the first step after: 1.5 s of it trained
    assert row["stall_s"] == pytest.approx(3.2)  # the fold's: from the last step before the taint
    assert row["pause_s"] == pytest.approx(1.2)  # the checkpointed step 7 -> step 8: the drain's cost
    assert row["lost_steps"] == 0


def test_a_killed_rank_pauses_from_its_last_step_and_replays(tmp_path: Path) -> None:
    """Steps 1-5, a kill at 5.5, a restart from step 3 trains step 4 again at 7.5: the pause is the fold's stall."""
    events = _events(tmp_path, [start(0)] + [step(n, n) for n in range(1, 6)]
                     + [start(7.0, resumed_from=3, restart_count=1), step(4, 7.5)])
    (row,) = pauses(analyse_faults([{"kind": "kill-rank", "time": T0 + 5.5}], events, []), events)
    assert row["pause_s"] == pytest.approx(2.5) == row["stall_s"] and row["lost_steps"] == 2


def figures(restart: dict[str, float], drain_stall: float | None, drain_lost: int) -> dict:
    rows = [{"kind": k, "restart_s": v, "pause_s": v, "detect_s": 0.1, "lost_steps": 0} for k, v in restart.items()]
    if drain_stall is not None:
        rows.append({"kind": "drain-node", "restart_s": 3.0, "pause_s": drain_stall, "detect_s": 0.1,
                     "lost_steps": drain_lost})
    return {"goodput": 0.93, "phase": "Succeeded", "by_kind": {k: kind_figures([r for r in rows if r["kind"] == k])
                                                                for k in KINDS}}


def test_the_spares_goals_hold_the_drain_to_its_stall_and_no_replayed_step() -> None:
    good = {"kill-rank": 1.5, "delete-pod": 2.0, "lose-node": 6.0}
    assert spares_met(figures(good, 0.8, 0))
    assert not spares_met(figures(good, 1.4, 0))  # stalled past 1 s
    assert not spares_met(figures(good, 0.8, 1))  # a drain replayed a step
    assert not spares_met(figures(good, None, 0))  # no drain measured: not met
    row = spares_row(figures(good, 0.8, 0))
    assert row["pass"] and "drain-node stall 0.8 s, at most 0 steps replayed" in row["metric"]
    assert "drain-node stall <= 1.0 s (medians) and 0 replayed steps" in row["goal"]
    assert figures(good, None, 0)["by_kind"]["drain-node"] == {"detect_s": None, "restart_s": None, "stall_s": None,
                                                               "lost_steps": None, "max_lost_steps": None,
                                                               "faults": 0}


def test_the_every_step_configuration_loses_nodes_only_and_passes_on_at_most_one_replayed_step() -> None:
    assert config_kinds("memory-every-step", KINDS) == ("lose-node",)
    assert config_kinds("memory-every-step", ("kill-rank",)) == ("kill-rank",)  # --kinds without node losses
    assert config_kinds("spares-memory", KINDS) == KINDS and config_steps("memory-every-step", 1000) == 500

    def config(lost: list[int]) -> dict:
        rows = [{"kind": "lose-node", "restart_s": 5.0, "pause_s": 5.0, "detect_s": 3.0, "lost_steps": n}
                for n in lost]
        return {"goodput": 0.6, "phase": "Succeeded", "by_kind": {"lose-node": kind_figures(rows)}}

    assert every_step_row(config([0, 1, 1]))["pass"]
    row = every_step_row(config([1, 2, 0]))
    assert not row["pass"] and row["value"] == 2 and "3 node losses" in row["metric"]
    assert not every_step_row(config([]))["pass"]  # no node loss measured: not met
