"""`bench.common.run_session`: a launcher that outlives its timeout is killed with everything it started, also
the workers it put in sessions of their own (as torch elastic does)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from bench.common import run_session
from tests.rank_processes import alive

# A launcher whose worker sits in a new session, like torch elastic's SubprocessHandler (start_new_session=True).
LAUNCHER = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(sys.argv[1], "w").write(str(worker.pid))
time.sleep(600)
"""


def test_a_timed_out_launcher_takes_its_own_session_workers_along(tmp_path: Path):
    pid_file = tmp_path / "worker.pid"
    began = time.monotonic()
    assert run_session([sys.executable, "-c", LAUNCHER, str(pid_file)], dict(os.environ), tmp_path, 3.0) is None
    assert time.monotonic() - began < 15
    worker = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(worker)


def test_a_launcher_that_ends_in_time_gives_its_exit_code(tmp_path: Path):
    assert run_session([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ), tmp_path, 30.0) == 3
