"""`python -m tests.k8s_emulator up` starts what the operator needs -- the API, the kubelet and an etcd -- by default;
`--no-etcd` leaves etcd out. (Here rather than in tests/emulator_fidelity/: it is the operator's test bed.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.k8s_emulator.__main__ import build_parser
from tests.k8s_emulator.runtime import ETCD_BINARY

REPO_ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "tests.k8s_emulator", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=90)


def test_etcd_is_on_unless_turned_off() -> None:
    parser = build_parser()
    assert parser.parse_args(["up", "--kubeconfig", "k"]).etcd is True
    assert parser.parse_args(["up", "--kubeconfig", "k", "--etcd"]).etcd is True  # the old spelling still works
    assert parser.parse_args(["up", "--kubeconfig", "k", "--no-etcd"]).etcd is False
    assert parser.parse_args(["serve", "--kubeconfig", "k"]).etcd is True


@pytest.mark.skipif(not Path(ETCD_BINARY).exists(), reason=f"needs {ETCD_BINARY} (scripts/install-tools.sh)")
def test_up_starts_etcd_by_default_and_not_with_no_etcd(tmp_path: Path) -> None:
    for flags, with_etcd in (((), True), (("--no-etcd",), False)):
        kubeconfig = tmp_path / f"kubeconfig{len(flags)}"
        up = _cli("up", "--kubeconfig", str(kubeconfig), "--nodes", "1", *flags)
        assert up.returncode == 0, up.stderr
        try:
            state = json.loads(kubeconfig.with_name(kubeconfig.name + ".state.json").read_text())
            with urllib.request.urlopen(f"{state['api_url']}/api/v1/nodes", timeout=10) as nodes:
                assert [n["metadata"]["name"] for n in json.loads(nodes.read())["items"]] == ["node-1"]
            if with_etcd:
                assert "etcd:" in up.stdout
                with urllib.request.urlopen(f"{state['etcd_url']}/health", timeout=10) as health:
                    assert json.loads(health.read())["health"] == "true"
            else:
                assert state["etcd_url"] is None and "etcd:" not in up.stdout
        finally:
            assert _cli("down", "--kubeconfig", str(kubeconfig)).returncode == 0
