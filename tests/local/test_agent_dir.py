"""An agent's own temporary folder (flywheel/agent/workdir.py): removed when the agent ends, and by the next agent
when the agent was killed; never while its agent lives, nor one whose pid now names another process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from flywheel.agent import workdir as agent_dir


@pytest.fixture
def tmp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _folder(root: Path, name: str, owner: str | None) -> Path:
    folder = root / f"{agent_dir.PREFIX}{name}"
    folder.mkdir()
    (folder / "stepped").write_text("")
    if owner is not None:
        (folder / agent_dir.OWNER).write_text(owner)
    return folder


def test_the_folder_holds_its_owner_and_goes_when_the_agent_ends(tmp_root: Path) -> None:
    with agent_dir.agent_dir() as own:
        assert own.parent == tmp_root and own.name.startswith(agent_dir.PREFIX)
        assert (own / agent_dir.OWNER).read_text() == agent_dir.identity(os.getpid())
        (own / "zygote.sock").write_text("")
    assert not own.exists()


def test_a_killed_agents_folder_is_removed_by_the_next_agent_and_no_other(tmp_root: Path) -> None:
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed_identity = agent_dir.identity(killed.pid)
    assert killed_identity.startswith(f"{killed.pid} ")
    orphan = _folder(tmp_root, "killed", killed_identity)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    live = _folder(tmp_root, "live", agent_dir.identity(os.getpid()))
    reused = _folder(tmp_root, "reused", f"{os.getpid()} 1")  # this pid, but another process's start time
    unowned = _folder(tmp_root, "unowned", None)  # still being made, or made by an older version
    with agent_dir.agent_dir():
        assert not orphan.exists() and not reused.exists()
        assert live.exists() and unowned.exists()


def test_identity_is_empty_for_a_process_that_is_gone() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert agent_dir.identity(gone.pid) == ""
    assert agent_dir.identity(os.getpid()).split()[0] == str(os.getpid())
