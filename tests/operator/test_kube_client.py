"""The operator's Kubernetes client against a test cluster that checks bearer tokens: an `exec` kubeconfig user
authenticates (the Kube client and the whole operator, kopf's login included), a wrong token fails with 401, and a
rotated service-account token file is picked up."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flywheel.crd import GROUP, PLURAL, VERSION
from flywheel.kube.auth import from_kubeconfig, service_account
from flywheel.kube.client import Connection, Kube, KubeApiError
from tests.k8s_emulator.fixtures import RunningCluster, start_cluster
from tests.k8s_emulator.runtime import TOKEN
from tests.operator.conftest import CRD, EXAMPLE, REPO, OperatorProcess, eventually
from tests.unit.test_kube_config import exec_user, write_exec_plugin, write_kubeconfig

EXEC_TOKEN = "exec-token-1"


@pytest.fixture
def checked(tmp_path: Path) -> Iterator[RunningCluster]:
    """A cluster that accepts only kubectl's token and EXEC_TOKEN (and its own kubelet's and pods')."""
    cluster = start_cluster(tmp_path / "cluster", nodes=2, etcd=True, node_monitor_grace_seconds=3.0,
                            heartbeat_seconds=0.5, accepted_tokens=[TOKEN, EXEC_TOKEN])
    try:
        yield cluster
    finally:
        cluster.stop()


def exec_kubeconfig(tmp_path: Path, cluster: RunningCluster, token: str) -> Path:
    script = write_exec_plugin(tmp_path / "plugin", token)
    return write_kubeconfig(tmp_path / "exec-kubeconfig", {"server": cluster.api_url}, exec_user(script))


async def list_nodes(kubeconfig: Path) -> list[str]:
    kube = Kube(await from_kubeconfig(kubeconfig))
    try:
        return [n["metadata"]["name"] for n in await kube.list("/api/v1/nodes")]
    finally:
        await kube.close()


def test_exec_user_authenticates_and_a_wrong_token_gets_401(checked: RunningCluster, tmp_path: Path) -> None:
    assert sorted(asyncio.run(list_nodes(exec_kubeconfig(tmp_path / "good", checked, EXEC_TOKEN)))) == [
        "node-1", "node-2"]
    with pytest.raises(KubeApiError) as err:
        asyncio.run(list_nodes(exec_kubeconfig(tmp_path / "bad", checked, "not-a-token")))
    assert err.value.status == 401 and err.value.body["reason"] == "Unauthorized"
    assert str(err.value) == "HTTP 401: Unauthorized"


async def rotate_service_account(cluster: RunningCluster, sa_dir: Path) -> list[str]:
    kube = Kube(service_account(sa_dir, cluster.api_url))
    try:
        seen = [str(len(await kube.list("/api/v1/nodes")))]
        cluster.api.accept_tokens("sa-2")  # the old token is revoked ...
        stale = Kube(service_account(sa_dir, cluster.api_url))
        with pytest.raises(KubeApiError, match="401"):
            await stale.list("/api/v1/nodes")
        await stale.close()
        stat = (sa_dir / "token").stat()
        (sa_dir / "token").write_text("sa-2")  # ... and the kubelet has written the new one
        os.utime(sa_dir / "token", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
        seen.append(str(len(await kube.list("/api/v1/nodes"))))  # re-read on the file's change
        cluster.api.accept_tokens("sa-3")
        (sa_dir / "token").write_text("sa-3")
        os.utime(sa_dir / "token", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a change stat misses
        seen.append(str(len(await kube.list("/api/v1/nodes"))))  # 401, re-read, retried
        return seen
    finally:
        await kube.close()


def test_rotated_service_account_token_is_picked_up(tmp_path: Path) -> None:
    sa_dir = tmp_path / "serviceaccount"
    sa_dir.mkdir()
    (sa_dir / "token").write_text("sa-1")
    with start_cluster(tmp_path / "cluster", nodes=1, accepted_tokens=["sa-1"]) as cluster:
        assert asyncio.run(rotate_service_account(cluster, sa_dir)) == ["1", "1", "1"]


async def admin_call(cluster: RunningCluster, method: str, path: str, body: Any = None) -> Any:
    """A request with kubectl's token. (kubectl itself cannot be used here: client-go sends no bearer token over
    plain http, and the test cluster serves no TLS.)"""
    kube = Kube(Connection(cluster.api_url, TOKEN))
    try:
        return await kube.request(method, path, body)
    finally:
        await kube.close()


def apply_job(cluster: RunningCluster, tmp_path: Path, name: str) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"], doc["metadata"]["namespace"] = name, "default"
    doc["spec"]["checkpoint"]["dir"] = str(tmp_path / "ckpt" / name)
    doc["spec"]["trainer"]["training"]["steps"] = 10
    asyncio.run(admin_call(cluster, "POST", Kube.custom(GROUP, VERSION, "default", PLURAL), doc))


def phase(cluster: RunningCluster, name: str) -> str | None:
    job = asyncio.run(admin_call(cluster, "GET", Kube.custom(GROUP, VERSION, "default", PLURAL, name)))
    return (job.get("status") or {}).get("phase")


@pytest.mark.slow
def test_operator_with_an_exec_user_reconciles_and_logs_in_again_after_rotation(checked: RunningCluster,
                                                                                tmp_path: Path) -> None:
    """The operator's only credentials come from the exec plugin; after the token is rotated (the old one
    revoked, watches dropped), kopf's login runs again and a second job still reconciles."""
    asyncio.run(admin_call(checked, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                           yaml.safe_load(CRD.read_text())))
    kubeconfig = exec_kubeconfig(tmp_path, checked, EXEC_TOKEN)
    checked.kubeconfig = kubeconfig  # what OperatorProcess passes as --kubeconfig
    operator = OperatorProcess(checked, None, tmp_path / "operator.log")
    operator.start()
    try:
        apply_job(checked, tmp_path, "exec-a")
        eventually(lambda: phase(checked, "exec-a") == "Succeeded", 120, "exec-a to succeed", interval=0.5)
        (tmp_path / "plugin" / "token").write_text("exec-token-2")
        checked.api.accept_tokens(TOKEN, "exec-token-2")
        checked.api.drop_watches()
        apply_job(checked, tmp_path, "exec-b")
        eventually(lambda: phase(checked, "exec-b") == "Succeeded", 120, "exec-b to succeed", interval=0.5)
        assert operator.proc is not None and operator.proc.poll() is None
        assert int((tmp_path / "plugin" / "runs").read_text()) >= 2  # the plugin ran again for the new token
    finally:
        operator.stop()


class PagedKube(Kube):
    """Answers LISTs in pages of two, as a real API server does for `limit=2` (the test cluster ignores limit)."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(Connection("http://unused"))
        self.names: list[str] = names
        self.calls: list[dict[str, str]] = []

    async def request(self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None,
                      content_type: str = "application/json") -> Any:
        assert params is not None
        self.calls.append(dict(params))
        start = int(params.get("continue", "0"))
        rest = self.names[start + 2:]
        return {"items": [{"metadata": {"name": n}} for n in self.names[start:start + 2]],
                "metadata": {"continue": str(start + 2)} if rest else {}}


def test_list_follows_continue_tokens() -> None:
    kube = PagedKube(["a", "b", "c", "d", "e"])
    items = asyncio.run(kube.list("/api/v1/pods", label_selector="x=y"))
    assert [i["metadata"]["name"] for i in items] == ["a", "b", "c", "d", "e"]
    assert [c.get("continue") for c in kube.calls] == [None, "2", "4"]
    assert all(c["labelSelector"] == "x=y" and c["limit"] == "500" for c in kube.calls)


def test_operator_stops_on_an_auth_provider_it_cannot_serve(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kc", {"server": "https://aks.example:443"},
                                  {"auth-provider": {"name": "azure", "config": {}}}, user_name="aks-admin")
    result = subprocess.run([sys.executable, "-m", "flywheel.cli", "operator", "--kubeconfig", str(kubeconfig),
                             "--etcd-endpoints", "127.0.0.1:1", "--operator-metrics-port", "0"],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode != 0
    assert "user 'aks-admin' uses auth-provider 'azure'" in result.stdout + result.stderr
