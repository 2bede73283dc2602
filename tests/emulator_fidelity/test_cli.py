"""`python -m tests.k8s_emulator up/down`: a background cluster with a real etcd that kubectl can use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.emulator_fidelity.conftest import KUBECTL

REPO_ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "tests.k8s_emulator", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=90)


@pytest.mark.skipif(not KUBECTL.exists() or not Path("/usr/bin/etcd").exists(),
                    reason="needs .tools/bin/kubectl and /usr/bin/etcd (scripts/install-tools.sh)")
def test_up_serves_kubectl_and_etcd_then_down_stops_everything(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    up = _cli("up", "--kubeconfig", str(kubeconfig), "--nodes", "3", "--etcd", "--work-dir", str(tmp_path / "w"))
    assert up.returncode == 0, up.stderr
    state = json.loads((tmp_path / "kubeconfig.state.json").read_text())
    try:
        nodes = subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), "--cache-dir", str(tmp_path / "c"),
                                "get", "nodes", "-o", "name"], capture_output=True, text=True, timeout=30)
        assert nodes.stdout.split() == ["node/node-1", "node/node-2", "node/node-3"], nodes.stderr
        with urllib.request.urlopen(f"{state['etcd_url']}/health", timeout=10) as health:
            assert json.loads(health.read())["health"] == "true"
        lost = _cli("fault", "--kubeconfig", str(kubeconfig), "lose-node", "node=node-2")
        assert json.loads(lost.stdout) == {"lost": "node-2"}
        assert _cli("status", "--kubeconfig", str(kubeconfig)).returncode == 0
    finally:
        down = _cli("down", "--kubeconfig", str(kubeconfig))
    assert down.returncode == 0, down.stderr
    assert not kubeconfig.exists() and not (tmp_path / "kubeconfig.state.json").exists()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{state['pid']}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{state['pid']}").exists()
    processes = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path / "w" / "etcd-data") not in processes  # etcd went down with the cluster


@pytest.mark.skipif(not Path("/usr/bin/etcd").exists(), reason="needs /usr/bin/etcd (scripts/install-tools.sh)")
def test_etcd_taken_port_is_retried_on_new_ports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A port found free and taken before etcd binds it (many clusters starting at once): etcd exits, and is
    started again on new ports."""
    import socket

    from tests import etcd_process

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: etcd cannot bind it, and nothing answers there
        ports = iter([taken.getsockname()[1]] * 2)
        real = etcd_process.free_port
        monkeypatch.setattr(etcd_process, "free_port", lambda: next(ports, None) or real())
        etcd = etcd_process.EtcdServer(tmp_path / "data")
        etcd.start()
        try:
            assert f":{taken.getsockname()[1]}" not in etcd.client_url
            assert "address already in use" in etcd.log_tail(20000)  # the first try's failure
        finally:
            etcd.stop()
