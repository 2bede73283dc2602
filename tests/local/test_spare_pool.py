"""The local spare pool's env rules and its choice of spare (flywheel/local/spare_pool.py), with fake processes."""

from __future__ import annotations

import io
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, cast

from flywheel.contracts.replica import REPLICA_INDEX_ENV, SPARE_ID_ENV, SPARE_PROMOTION_FILE_ENV, is_spare
from flywheel.contracts.spare_promotion import Promotion, mark_ready, read_promotion_file
from flywheel.local.spare_pool import SparePool, promotion_env, spare_env

WORKER_1 = {"PET_RDZV_ID": "default-job", REPLICA_INDEX_ENV: "1", "FLYWHEEL_METRICS_PORT": "9401",
            "FLYWHEEL_TERMINATION_LOG": "/out/logs/worker-1.termination-log", "FLYWHEEL_JOB": "default/job"}


def test_a_spare_is_a_worker_without_its_replica_and_a_promotion_carries_what_differs(tmp_path: Path) -> None:
    env = spare_env({**WORKER_1, "FLYWHEEL_TERMINATION_LOG": "x"}, "spare-3", tmp_path / "p.json")
    assert is_spare(env) and REPLICA_INDEX_ENV not in env and env["FLYWHEEL_METRICS_PORT"] == "0"
    assert env[SPARE_ID_ENV] == "spare-3" and env[SPARE_PROMOTION_FILE_ENV] == str(tmp_path / "p.json")
    generation_1 = {**WORKER_1, "PET_RDZV_ID": "default-job-g1"}
    assert promotion_env(env, generation_1) == {
        REPLICA_INDEX_ENV: "1", "FLYWHEEL_METRICS_PORT": "9401", "PET_RDZV_ID": "default-job-g1",
        "FLYWHEEL_TERMINATION_LOG": "/out/logs/worker-1.termination-log"}


class FakePopen:
    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        return self.returncode


def test_the_oldest_ready_spare_is_promoted_and_none_running_means_a_cold_start(tmp_path: Path) -> None:
    started: list[Mapping[str, str]] = []

    def start(env: Mapping[str, str], log_name: str) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
        started.append(env)
        return cast(Any, FakePopen(1000 + len(started))), io.BytesIO()

    notices: list[str] = []
    template = {k: v for k, v in WORKER_1.items() if k != "FLYWHEEL_TERMINATION_LOG"}  # as the supervisor's
    pool = SparePool(2, tmp_path, start, notices.append)
    pool.fill(template)
    assert [e[SPARE_ID_ENV] for e in started] == ["spare-0", "spare-1"]
    mark_ready(pool.spares[1].promotion_file)  # spare-1 has imported the trainer, spare-0 not yet
    chosen = pool.promote(0, {**WORKER_1, REPLICA_INDEX_ENV: "0"})
    assert chosen is not None and chosen.spare_id == "spare-1"
    assert read_promotion_file(chosen.promotion_file) == Promotion("0", {
        REPLICA_INDEX_ENV: "0", "FLYWHEEL_METRICS_PORT": "9401",
        "FLYWHEEL_TERMINATION_LOG": "/out/logs/worker-1.termination-log"})
    pool.fill(template)
    assert [s.spare_id for s in pool.spares] == ["spare-0", "spare-2"]  # names are never reused
    cast(Any, pool.spares[0].popen).returncode = 1  # spare-0 died while waiting: replaced, with a notice
    pool.reap(template)
    assert [s.spare_id for s in pool.spares] == ["spare-2", "spare-3"] and "spare-0 exited 1" in notices[0]
    assert pool.promote(1, WORKER_1) is not None  # none ready: the oldest still importing beats a cold start
    for spare in pool.spares:
        cast(Any, spare.popen).returncode = 0
    assert pool.promote(1, WORKER_1) is None
