"""`flywheel launch`: settings from the PET_* env, exit codes, no restart of USER_ERROR, SIGTERM handling."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from conftest import PYTHON, REPO, SCRIPTS, alive, child_env

from flywheel.agent.agent import first_failure_exit_code
from flywheel.agent.settings import LaunchConfigError, settings_from_env
from flywheel.contracts import exitcodes
from flywheel.local.procs import descendants

BASE_ENV = {"PET_NNODES": "1:2", "PET_NPROC_PER_NODE": "2", "PET_RDZV_BACKEND": "c10d",
            "PET_RDZV_ENDPOINT": "127.0.0.1:29400", "PET_RDZV_ID": "job", "PET_MAX_RESTARTS": "4"}


def test_settings_follow_the_contract_env():
    s = settings_from_env(BASE_ENV)
    assert (s.min_nodes, s.max_nodes, s.nproc_per_node, s.max_restarts) == (1, 2, 2, 4)
    assert (s.rdzv_backend, s.rdzv_endpoint, s.run_id) == ("c10d", "127.0.0.1:29400", "job")
    assert s.command == (sys.executable, "-m", "flywheel.trainer")
    # fast, clean restarts (docs/architecture.md): 1 s last call, >= 3 keep-alive attempts; the store is hosted
    # elsewhere
    assert s.rdzv_configs["last_call_timeout"] == 1 and s.rdzv_configs["keep_alive_max_attempt"] >= 3
    assert s.rdzv_configs["is_host"] is False
    assert s.local_addr == "127.0.0.1"


def test_user_command_and_rdzv_conf_overrides():
    s = settings_from_env({**BASE_ENV, "PET_NNODES": "3", "PET_RDZV_CONF": "join_timeout=30,is_host=true"},
                          ["train.py", "--lr", "1"])
    assert (s.min_nodes, s.max_nodes) == (3, 3)
    assert s.command == (sys.executable, "-u", "train.py", "--lr", "1")  # a bare script runs as with torchrun
    assert s.rdzv_configs["join_timeout"] == "30" and s.rdzv_configs["is_host"] == "true"
    assert settings_from_env(BASE_ENV, ["bash", "-c", "true"]).command == ("bash", "-c", "true")


def test_a_torch_without_the_agent_seams_is_refused_with_what_it_lacks(monkeypatch, tmp_path):
    from flywheel import torch_compat
    from flywheel.agent import launch

    reason_file = tmp_path / "termination-log"
    for key, value in {**BASE_ENV, "FLYWHEEL_TERMINATION_LOG": str(reason_file)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(torch_compat, "agent_seam_problems", lambda: ["LocalElasticAgent() takes no shutdown_timeout"])
    monkeypatch.setattr(launch, "run_agent", lambda settings: pytest.fail("the agent started"))
    assert launch.main([]) == exitcodes.USER_ERROR
    reason = reason_file.read_text()
    assert f"needs torch {torch_compat.TESTED_TORCH}.x" in reason and "takes no shutdown_timeout" in reason


@pytest.mark.parametrize("env, problem", [
    ({"PET_NNODES": "2:1"}, "min <= max"),
    ({"PET_NNODES": "two"}, "not N or MIN:MAX"),
    ({"PET_NPROC_PER_NODE": "x"}, "not an integer"),
    ({"PET_RDZV_ENDPOINT": ""}, "PET_RDZV_ENDPOINT is not set"),
    ({"PET_RDZV_CONF": "keep_alive_max_attempt=2"}, "split brain|two groups"),
])
def test_bad_env_is_rejected(env, problem):
    with pytest.raises(LaunchConfigError, match=problem):
        settings_from_env({**BASE_ENV, **env})


def test_first_failure_exit_code():
    # the rank that failed first, not the ranks the agent then stopped with SIGTERM
    assert first_failure_exit_code({0: (-15, 100.0), 1: (1, 100.0)}) == 1
    assert first_failure_exit_code({0: (5, 101.0), 1: (-9, 100.0)}) == 128 + 9
    assert first_failure_exit_code({0: (1, 100.0), 1: (exitcodes.USER_ERROR, 102.0)}) == exitcodes.USER_ERROR
    assert first_failure_exit_code({2: (4, 100.0), 3: (4, 100.0)}) == 4


def _launch(store: str, run_id: str, tmp_path, code: int, restarts: int, **extra: str) -> tuple[int, list[str]]:
    log = tmp_path / "attempts.log"
    env = child_env(PET_NNODES="1", PET_NPROC_PER_NODE="2", PET_RDZV_BACKEND="c10d", PET_RDZV_ENDPOINT=store,
                    PET_RDZV_ID=run_id, PET_MAX_RESTARTS=str(restarts), EXIT_RANK_LOG=str(log),
                    EXIT_RANK_WHICH="1", EXIT_RANK_CODE=str(code), **extra)
    proc = subprocess.run([PYTHON, "-m", "flywheel.cli", "launch", "--", str(SCRIPTS / "exit_rank.py")], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=90)
    return proc.returncode, sorted(log.read_text().split("\n")[:-1])


@pytest.mark.slow
def test_user_error_is_not_restarted(rdzv_store, tmp_path):
    rc, attempts = _launch(rdzv_store, "user-error", tmp_path, exitcodes.USER_ERROR, restarts=3)
    assert rc == exitcodes.USER_ERROR
    assert attempts == ["0 0", "1 0"]  # one attempt per rank: no restart


@pytest.mark.slow
def test_crash_is_restarted_then_reported(rdzv_store, tmp_path):
    rc, attempts = _launch(rdzv_store, "crash", tmp_path, exitcodes.COLLECTIVE_TIMEOUT, restarts=1)
    assert rc == exitcodes.COLLECTIVE_TIMEOUT
    assert attempts == ["0 0", "0 1", "1 0", "1 1"]


@pytest.mark.slow
def test_a_restart_that_succeeds_exits_zero(rdzv_store, tmp_path):
    rc, attempts = _launch(rdzv_store, "once", tmp_path, -9, restarts=2, EXIT_RANK_ONCE="1")
    assert rc == 0
    assert attempts == ["0 0", "0 1", "1 0", "1 1"]


@pytest.mark.slow
def test_the_same_crash_before_the_first_step_is_not_restarted_in_place_again(rdzv_store, tmp_path):
    """An import error or a bad config crashes every attempt before its first step: after two in a row with the same
    reason the pod fails with it (the job's restart policy decides), not after PET_MAX_RESTARTS attempts."""
    said = tmp_path / "termination-log"
    rc, attempts = _launch(rdzv_store, "startup-crash", tmp_path, 0, restarts=5, EXIT_RANK_RAISE="no module named x",
                           FLYWHEEL_TERMINATION_LOG=str(said))
    assert rc == exitcodes.CRASH
    assert attempts == ["0 0", "0 1", "1 0", "1 1"]
    assert said.read_text() == "RuntimeError: no module named x"


@pytest.mark.slow
def test_a_crash_after_the_first_step_is_restarted_in_place(rdzv_store, tmp_path):
    rc, attempts = _launch(rdzv_store, "crash-after-step", tmp_path, 0, restarts=2, EXIT_RANK_RAISE="diverged",
                           EXIT_RANK_STEP="1", FLYWHEEL_TERMINATION_LOG=str(tmp_path / "termination-log"))
    assert rc == exitcodes.CRASH
    assert attempts == ["0 0", "0 1", "0 2", "1 0", "1 1", "1 2"]


def test_a_signal_death_exits_128_plus_n(rdzv_store, tmp_path):
    said = tmp_path / "termination-log"
    rc, attempts = _launch(rdzv_store, "sigkill", tmp_path, -9, restarts=0, FLYWHEEL_TERMINATION_LOG=str(said))
    assert rc == 128 + signal.SIGKILL
    assert attempts == ["0 0", "1 0"]
    assert said.read_text() == "rank 1: killed by SIGKILL"  # the agent's view, for the pod's termination message


def test_sigterm_stops_the_ranks_and_exits_stopped(rdzv_store, tmp_path):
    log = tmp_path / "attempts.log"
    env = child_env(PET_NNODES="1", PET_NPROC_PER_NODE="2", PET_RDZV_BACKEND="c10d", PET_RDZV_ENDPOINT=rdzv_store,
                    PET_RDZV_ID="sigterm", PET_MAX_RESTARTS="3", EXIT_RANK_LOG=str(log), EXIT_RANK_WHICH="9",
                    EXIT_RANK_CODE="0", FLYWHEEL_TERMINATION_LOG=str(tmp_path / "said"))  # no rank exits by itself
    proc = subprocess.Popen([PYTHON, "-m", "flywheel.cli", "launch", "--", str(SCRIPTS / "exit_rank.py")],
                            env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (log.exists() and len(log.read_text().split()) == 4) and time.monotonic() < deadline:
            time.sleep(0.1)
        ranks = descendants(proc.pid)
        assert len(log.read_text().split()) == 4, "ranks did not start"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=40) == exitcodes.STOPPED
        time.sleep(0.2)
        assert not [pid for pid in ranks if alive(pid)]
        assert (tmp_path / "said").read_text() == "stopped by SIGTERM"
    finally:
        proc.kill()
        proc.wait()


def test_ranks_die_with_their_agent(rdzv_store, tmp_path):
    """A worker lost whole takes its ranks along (they are in their own sessions, so this is PDEATHSIG's job)."""
    log = tmp_path / "attempts.log"
    env = child_env(PET_NNODES="1", PET_NPROC_PER_NODE="2", PET_RDZV_BACKEND="c10d", PET_RDZV_ENDPOINT=rdzv_store,
                    PET_RDZV_ID="agent-lost", PET_MAX_RESTARTS="0", EXIT_RANK_LOG=str(log), EXIT_RANK_WHICH="9",
                    EXIT_RANK_CODE="0")
    proc = subprocess.Popen([PYTHON, "-m", "flywheel.cli", "launch", "--", str(SCRIPTS / "exit_rank.py")],
                            env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (log.exists() and len(log.read_text().split()) == 4) and time.monotonic() < deadline:
            time.sleep(0.1)
        ranks = descendants(proc.pid)
        assert len(ranks) >= 2
        proc.kill()  # the agent only
        proc.wait()
        deadline = time.monotonic() + 5
        while [pid for pid in ranks if alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in ranks if alive(pid)] == []
    finally:
        proc.kill()
        proc.wait()
