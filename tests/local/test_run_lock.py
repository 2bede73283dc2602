"""One `flywheel run` per output and checkpoint directory: a second run of the same job is refused before it wipes
the first one's logs or touches its checkpoints, and a run that died (even by SIGKILL) leaves no lock behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, child_env, write_job

from flywheel.local.run_lock import DirectoryInUse, run_lock

_BODY = "  replicas: {min: 1, max: 1}\n  command: [python, -c, 'print(1)']\n  checkpoint: {dir: %s}\n"


def _run(job: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "flywheel.cli", "run", str(job), "--out", str(out), "--no-progress"],
                          cwd=REPO, env=child_env(COLUMNS="300"), capture_output=True, text=True, timeout=120)


def test_a_second_run_is_refused_while_the_first_holds_its_output_directory(tmp_path: Path) -> None:
    job = write_job(tmp_path / "job.yaml", "locked", _BODY % (tmp_path / "ckpt"))
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    (out / "events.jsonl").write_text('{"event": "step"}\n')  # the first run's
    with run_lock({"output directory (--out)": out}, "first.yaml"):
        refused = _run(job, out)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    said = " ".join(refused.stdout.split())
    assert f"output directory (--out) {out} is in use by another flywheel run (pid {os.getpid()}, first.yaml" in said
    assert "give this run another output directory (--out)" in said
    assert (out / "events.jsonl").read_text() == '{"event": "step"}\n'  # not wiped
    finished = _run(job, out)  # the first one ended: this one runs
    assert finished.returncode == 0, finished.stdout + finished.stderr


def test_two_runs_sharing_a_checkpoint_directory_are_refused_too(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    job = write_job(tmp_path / "job.yaml", "shared", _BODY % ckpt)
    with run_lock({"checkpoint.dir": ckpt}, "other.yaml"):
        refused = _run(job, tmp_path / "another-out")
    assert refused.returncode == 1
    assert f"checkpoint.dir {ckpt} is in use by another flywheel run" in " ".join(refused.stdout.split())


def test_the_lock_is_released_when_its_holder_is_killed(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from flywheel.local.run_lock import run_lock
        with run_lock({{"checkpoint.dir": Path({str(tmp_path)!r})}}, "held.yaml"):
            print("held", flush=True)
            time.sleep(60)
        """)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(DirectoryInUse, match=f"pid {holder.pid}, held.yaml, since "):
            with run_lock({"checkpoint.dir": tmp_path}, "mine.yaml"):
                pass
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        with run_lock({"checkpoint.dir": tmp_path}, "mine.yaml"):
            pass
    finally:
        holder.kill()
        holder.wait()


def test_a_refused_lock_holds_none_of_the_others(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    with run_lock({"checkpoint.dir": second}, "other.yaml"):
        with pytest.raises(DirectoryInUse):
            with run_lock({"--out": first, "checkpoint.dir": second}, "mine.yaml"):
                pass
        with run_lock({"--out": first}, "third.yaml"):  # `first` was released when `second` was refused
            pass


def test_one_directory_named_twice_is_locked_once(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    with run_lock({"output directory (--out)": tmp_path, "checkpoint.dir": tmp_path / "sub" / ".."}, "mine.yaml"):
        with pytest.raises(DirectoryInUse):
            with run_lock({"checkpoint.dir": tmp_path}, "other.yaml"):
                pass
