"""The operator's Kubernetes client against the test cluster's real kube-apiserver, which authenticates every
request: an `exec` kubeconfig user authenticates (the Kube client and the whole operator, kopf's login included), a
wrong token fails with 401, and a rotated service-account token file is picked up. The tokens are real
ServiceAccount tokens (TokenRequest) bound to a Secret each: deleting the Secret revokes the token."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flywheel.kube.auth import from_kubeconfig, service_account
from flywheel.kube.client import Connection, Kube, KubeApiError
from flywheel.spec.crd.generate import GROUP, PLURAL, VERSION
from tests.cluster.cluster import TestCluster as RunningCluster
from tests.cluster.fixtures import start_cluster
from tests.kube.test_kubeconfig import exec_user, write_exec_plugin, write_kubeconfig
from tests.operator.conftest import CRD, EXAMPLE, REPO, OperatorProcess, eventually

NS = "default"
# A token the API server accepted stays accepted from its cache a while (kube-apiserver: 10 s) after revocation.
REVOKE_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    running = start_cluster(tmp_path_factory.mktemp("cluster"), nodes=2, etcd=True, node_monitor_grace_seconds=3.0,
                            heartbeat_seconds=0.5)
    try:
        running.add_claim("flywheel-ckpt")  # the example's checkpoint claim: kube-scheduler waits for it
        yield running
    finally:
        running.stop()


def as_admin(cluster: RunningCluster, act: Callable[[Kube], Awaitable[Any]]) -> Any:
    """`act` with a client of the cluster's admin (its static token)."""
    async def main() -> Any:
        kube = Kube(Connection(cluster.api_url, cluster.admin_token, str(cluster.ca_file)))
        try:
            return await act(kube)
        finally:
            await kube.close()
    return asyncio.run(main())


async def issue_token(kube: Kube, account: str, secret: str) -> str:
    """A token of ServiceAccount `account` bound to a new Secret `secret`. The account is cluster-admin: these tests
    are about who is authenticated, not what they may do."""
    if await kube.create(Kube.core(NS, "serviceaccounts"), {"metadata": {"name": account}}) is not None:
        await kube.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "metadata": {"name": f"test-{account}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": NS}]})
    bound = await kube.create(Kube.core(NS, "secrets"), {"metadata": {"name": secret}})
    assert bound is not None, f"secret {secret} exists already"
    answer = await kube.create(Kube.core(NS, "serviceaccounts", account) + "/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": [], "boundObjectRef": {"apiVersion": "v1", "kind": "Secret", "name": secret,
                                                     "uid": bound["metadata"]["uid"]}}})
    assert answer is not None
    return str(answer["status"]["token"])


def token_of(cluster: RunningCluster, account: str, secret: str) -> str:
    return str(as_admin(cluster, lambda kube: issue_token(kube, account, secret)))


async def refused(cluster: RunningCluster, token: str) -> bool:
    """Whether the API server answers `token` with 401."""
    kube = Kube(Connection(cluster.api_url, token, str(cluster.ca_file)))
    try:
        await kube.list("/api/v1/nodes")
        return False
    except KubeApiError as err:
        return err.status == 401
    finally:
        await kube.close()


def revoke(cluster: RunningCluster, secret: str, token: str) -> None:
    """Delete the Secret `token` is bound to, and wait until the API server refuses the token."""
    as_admin(cluster, lambda kube: kube.delete(Kube.core(NS, "secrets", secret)))
    eventually(lambda: asyncio.run(refused(cluster, token)), REVOKE_TIMEOUT_S, f"the token of {secret} refused",
               interval=0.5)


def exec_kubeconfig(tmp_path: Path, cluster: RunningCluster, token: str) -> Path:
    script = write_exec_plugin(tmp_path / "plugin", token)
    return write_kubeconfig(tmp_path / "exec-kubeconfig",
                            {"server": cluster.api_url, "certificate-authority": str(cluster.ca_file)},
                            exec_user(script))


async def list_nodes(kubeconfig: Path) -> list[str]:
    kube = Kube(await from_kubeconfig(kubeconfig))
    try:
        return [n["metadata"]["name"] for n in await kube.list("/api/v1/nodes")]
    finally:
        await kube.close()


def test_exec_user_authenticates_and_a_wrong_token_gets_401(cluster: RunningCluster, tmp_path: Path) -> None:
    token = token_of(cluster, "exec-user", "exec-user-1")
    assert sorted(asyncio.run(list_nodes(exec_kubeconfig(tmp_path / "good", cluster, token)))) == [
        "node-1", "node-2"]
    with pytest.raises(KubeApiError) as err:
        asyncio.run(list_nodes(exec_kubeconfig(tmp_path / "bad", cluster, "not-a-token")))
    assert err.value.status == 401 and err.value.body["reason"] == "Unauthorized"
    assert str(err.value) == "HTTP 401: Unauthorized"


def write_token(sa_dir: Path, token: str, mtime_ns: int) -> None:
    """The kubelet's swap of the token file, here with a chosen mtime."""
    (sa_dir / "token").write_text(token)
    os.utime(sa_dir / "token", ns=(mtime_ns, mtime_ns))


async def rotate_service_account(cluster: RunningCluster, sa_dir: Path, tokens: list[str]) -> list[str]:
    """`tokens`: bound to the Secrets rotated-1, -2 and -3."""
    write_token(sa_dir, tokens[0], time.time_ns())
    kube = Kube(service_account(sa_dir, cluster.api_url))
    try:
        seen = [str(len(await kube.list("/api/v1/nodes")))]
        await asyncio.to_thread(revoke, cluster, "rotated-1", tokens[0])  # the old token is revoked ...
        moved = (sa_dir / "token").stat().st_mtime_ns + 1_000_000
        write_token(sa_dir, tokens[1], moved)  # ... and the kubelet has written the new one
        seen.append(str(len(await kube.list("/api/v1/nodes"))))  # re-read on the file's change
        await asyncio.to_thread(revoke, cluster, "rotated-2", tokens[1])
        write_token(sa_dir, tokens[2], moved)  # a change stat misses
        seen.append(str(len(await kube.list("/api/v1/nodes"))))  # 401, re-read, retried
        return seen
    finally:
        await kube.close()


def test_rotated_service_account_token_is_picked_up(cluster: RunningCluster, tmp_path: Path) -> None:
    sa_dir = tmp_path / "serviceaccount"
    sa_dir.mkdir()
    shutil.copy(cluster.ca_file, sa_dir / "ca.crt")  # as the kubelet mounts it beside the token
    tokens = [token_of(cluster, "rotated", f"rotated-{i}") for i in (1, 2, 3)]
    assert asyncio.run(rotate_service_account(cluster, sa_dir, tokens)) == ["2", "2", "2"]


def apply_job(cluster: RunningCluster, tmp_path: Path, name: str) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"], doc["metadata"]["namespace"] = name, "default"
    doc["spec"]["checkpoint"]["dir"] = str(tmp_path / "ckpt" / name)
    doc["spec"]["trainer"]["training"]["steps"] = 10
    as_admin(cluster, lambda kube: kube.request("POST", Kube.custom(GROUP, VERSION, "default", PLURAL), doc))


def phase(cluster: RunningCluster, name: str) -> str | None:
    job = as_admin(cluster, lambda kube: kube.request("GET", Kube.custom(GROUP, VERSION, "default", PLURAL, name)))
    return (job.get("status") or {}).get("phase")


@pytest.mark.slow
def test_operator_with_an_exec_user_reconciles_and_logs_in_again_after_rotation(cluster: RunningCluster,
                                                                                tmp_path: Path) -> None:
    """The operator's only credentials come from the exec plugin; after the token is rotated (the old one
    revoked, watches dropped), kopf's login runs again and a second job still reconciles."""
    as_admin(cluster, lambda kube: kube.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                                               yaml.safe_load(CRD.read_text())))
    cluster.wait_established("trainingjobs.flywheel.dev")
    first = token_of(cluster, "exec-operator", "exec-operator-1")
    admin_kubeconfig, cluster.kubeconfig = cluster.kubeconfig, exec_kubeconfig(tmp_path, cluster, first)
    operator = OperatorProcess(cluster, None, tmp_path / "operator.log")  # passes cluster.kubeconfig
    operator.start()
    try:
        apply_job(cluster, tmp_path, "exec-a")
        eventually(lambda: phase(cluster, "exec-a") == "Succeeded", 120, "exec-a to succeed", interval=0.5)
        (tmp_path / "plugin" / "token").write_text(token_of(cluster, "exec-operator", "exec-operator-2"))
        revoke(cluster, "exec-operator-1", first)
        assert cluster.api is not None
        cluster.api.drop_watches()
        apply_job(cluster, tmp_path, "exec-b")
        eventually(lambda: phase(cluster, "exec-b") == "Succeeded", 120, "exec-b to succeed", interval=0.5)
        assert operator.proc is not None and operator.proc.poll() is None
        assert int((tmp_path / "plugin" / "runs").read_text()) >= 2  # the plugin ran again for the new token
    finally:
        operator.stop()
        cluster.kubeconfig = admin_kubeconfig


class PagedKube(Kube):
    """Answers LISTs in pages of two, as a real API server does for `limit=2`."""

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
