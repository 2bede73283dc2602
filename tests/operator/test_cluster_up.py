"""`python -m tests.cluster up` starts what the operator needs -- the real control plane, the process kubelet and an
etcd for rendezvous -- by default, `--no-etcd` leaves that etcd out; `status` says whether it is up and `down` ends it
all. (Here rather than in tests/k8s/: it is the operator's test bed.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.etcd_process import ETCD_BINARY
from tests.operator.conftest import KUBECTL
from tests.rank_processes import alive

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(not Path(ETCD_BINARY).exists(), reason=f"needs {ETCD_BINARY} (scripts/install-tools.sh)"),
    pytest.mark.skipif(not KUBECTL.exists(), reason="real kubectl missing: run scripts/install-tools.sh")]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "tests.cluster", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=180)


def _check_up(kubeconfig: Path, up: subprocess.CompletedProcess[str], with_etcd: bool) -> dict[str, Any]:
    """The cluster `up` started: its API through the real kubectl and the kubeconfig it wrote, `status`, and the
    rendezvous etcd if asked for. Returns its state."""
    state: dict[str, Any] = json.loads(kubeconfig.with_name(kubeconfig.name + ".state.json").read_text())
    nodes = subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), "get", "nodes", "-o", "name"],
                           capture_output=True, text=True, timeout=60)
    assert nodes.returncode == 0 and nodes.stdout.split() == ["node/node-1"], nodes.stderr
    status = _cli("status", "--kubeconfig", str(kubeconfig))
    assert status.returncode == 0, status.stderr
    assert state["api_url"] in status.stdout and f"pid:        {state['pid']}" in status.stdout
    if with_etcd:
        assert "etcd:" in up.stdout
        with urllib.request.urlopen(f"{state['etcd_url']}/health", timeout=10) as health:
            assert json.loads(health.read())["health"] == "true"
    else:
        assert state["etcd_url"] is None and "etcd:" not in up.stdout
    return state


def test_up_starts_etcd_by_default_and_not_with_no_etcd_and_down_ends_it(tmp_path: Path) -> None:
    for flags, with_etcd in (((), True), (("--no-etcd",), False)):
        kubeconfig = tmp_path / f"kubeconfig{len(flags)}"
        up = _cli("up", "--kubeconfig", str(kubeconfig), "--nodes", "1", *flags)
        assert up.returncode == 0, up.stderr
        state: dict[str, Any] = {}
        try:
            state = _check_up(kubeconfig, up, with_etcd)
        finally:
            assert _cli("down", "--kubeconfig", str(kubeconfig)).returncode == 0
        assert not alive(state["pid"]) and not kubeconfig.exists()
        assert not Path(state["work_dir"]).exists()  # up made it: down removes it
        down = _cli("status", "--kubeconfig", str(kubeconfig))
        assert down.returncode == 1 and down.stdout.strip() == "down"
