"""The API's cache and actions on the shared client (flywheel/kube) against the test cluster's real API server: a
kubeconfig whose user is an `exec` plugin printing a ServiceAccount's token (TokenRequest, allowed by a Role)
authenticates the watches and the patches, and when the token is revoked (the Secret it is bound to deleted) and the
plugin prints a new one, the next watch's 401 renews the credentials (the plugin runs again) and the cache carries
on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from flywheel.api.cache import KubeCache
from flywheel.api.job_actions import KubeActions
from flywheel.kube.client import Connection, Kube, load_credentials
from flywheel.spec.crd.generate import GROUP, PLURAL, VERSION
from tests.api.conftest import CRD, CRD_NAME, job_doc, kubectl, service_account_token
from tests.cluster.cluster import TestCluster
from tests.cluster.fixtures import start_cluster
from tests.kube.test_kubeconfig import exec_user, write_exec_plugin, write_kubeconfig

JOBS = Kube.custom(GROUP, VERSION, "default", PLURAL)
ACCOUNT = "api-cache"
# What the cache and the actions need in one namespace, and two Secrets for the account's tokens to be bound to.
RBAC = [
    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT}},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": ACCOUNT}, "rules": [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["get", "list", "watch"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": ACCOUNT},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ACCOUNT},
     "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": "default"}]},
    *({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}} for name in ("exec-1", "exec-2"))]


async def until(check: Callable[[], Any], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def prepare(cluster: TestCluster, tmp_path: Path) -> tuple[str, str]:
    """The CRD and the account; returns its two tokens, each bound to its own Secret."""
    (tmp_path / "setup.yaml").write_text(yaml.safe_dump_all([yaml.safe_load(CRD.read_text()), *RBAC]))
    kubectl(cluster, "apply", "-f", str(tmp_path / "setup.yaml"))
    cluster.wait_established(CRD_NAME)
    first, second = (service_account_token(cluster, ACCOUNT, bound_secret=s) for s in ("exec-1", "exec-2"))
    return first, second


async def exec_user_and_rotation(cluster: TestCluster, tmp_path: Path, first: str, second: str) -> None:
    admin = Kube(Connection(cluster.api_url, cluster.admin_token, ca_file=str(cluster.ca_file)))
    plugin = write_exec_plugin(tmp_path / "plugin", first)
    server = {"server": cluster.api_url, "certificate-authority": str(cluster.ca_file)}
    kube = Kube(await load_credentials(str(write_kubeconfig(tmp_path / "kubeconfig", server, exec_user(plugin)))))
    cache = KubeCache(kube, "default", watch_seconds=1).start()
    try:
        assert await cache.wait_synced(15), "the cache did not sync with the exec plugin's token"
        await admin.create(JOBS, job_doc("before"))
        await until(lambda: cache.job("default", "before"), "the first job in the cache")
        patched = await KubeActions(kube).suspend("default", "before", True)
        assert patched["spec"]["suspend"] is True and kube.credentials.renewals == 0

        (tmp_path / "plugin" / "token").write_text(second)  # the plugin now prints the second token
        await admin.delete("/api/v1/namespaces/default/secrets/exec-1")  # the first token is revoked with it
        # Each watch lasts 1 s: one after the API server stops taking the first token (its token cache holds an
        # accepted token up to 10 s) gets 401, and the credentials are renewed (the plugin runs again).
        await until(lambda: kube.credentials.renewals >= 1, "a 401 to renew the credentials", timeout=40)
        await admin.create(JOBS, job_doc("after"))
        await until(lambda: cache.job("default", "after"), "a job created after the rotation in the cache")
        assert kube.credentials.conn.token == second and cache.ready()
    finally:
        await cache.stop()
        await kube.close()
        await admin.close()


def test_exec_user_drives_the_cache_and_a_revoked_token_is_renewed_from_a_watch(tmp_path: Path) -> None:
    with start_cluster(tmp_path / "cluster", nodes=0) as cluster:
        first, second = prepare(cluster, tmp_path)
        asyncio.run(exec_user_and_rotation(cluster, tmp_path, first, second))
