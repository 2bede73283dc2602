"""The API's cache and actions on the shared client (flywheel/kube) against a test cluster that checks bearer tokens:
a kubeconfig whose user is an `exec` plugin authenticates the watches and the patches, and when the plugin's token
is rotated (the old one revoked) the next watch's 401 renews the credentials (the plugin runs again) and the cache
carries on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from flywheel.api.cache import KubeCache
from flywheel.api.job_actions import KubeActions
from flywheel.crd import GROUP, PLURAL, VERSION
from flywheel.kube.client import Connection, Kube, load_credentials
from tests.api.conftest import CRD, job_doc
from tests.k8s_emulator.fixtures import RunningCluster, start_cluster
from tests.k8s_emulator.runtime import TOKEN
from tests.unit.test_kube_config import exec_user, write_exec_plugin, write_kubeconfig

JOBS = Kube.custom(GROUP, VERSION, "default", PLURAL)


async def until(check: Callable[[], Any], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def exec_user_and_rotation(cluster: RunningCluster, tmp_path: Path) -> None:
    admin = Kube(Connection(cluster.api_url, TOKEN))
    await admin.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", yaml.safe_load(CRD.read_text()))
    plugin = write_exec_plugin(tmp_path / "plugin", "exec-1")
    kube = Kube(await load_credentials(str(write_kubeconfig(tmp_path / "kubeconfig", {"server": cluster.api_url},
                                                            exec_user(plugin)))))
    cache = KubeCache(kube, "default", watch_seconds=1).start()
    try:
        assert await cache.wait_synced(15), "the cache did not sync with the exec plugin's token"
        await admin.create(JOBS, job_doc("before"))
        await until(lambda: cache.job("default", "before"), "the first job in the cache")
        patched = await KubeActions(kube).suspend("default", "before", True)
        assert patched["spec"]["suspend"] is True and kube.credentials.renewals == 0

        cluster.api.accept_tokens(TOKEN, "exec-2")  # exec-1 revoked; the plugin now prints exec-2
        (tmp_path / "plugin" / "token").write_text("exec-2")
        # each watch lasts 1 s: the next one gets 401, and the credentials are renewed (the plugin runs again)
        await until(lambda: kube.credentials.renewals >= 1, "a 401 to renew the credentials")
        await admin.create(JOBS, job_doc("after"))
        await until(lambda: cache.job("default", "after"), "a job created after the rotation in the cache")
        assert kube.credentials.conn.token == "exec-2" and cache.ready()
    finally:
        await cache.stop()
        await kube.close()
        await admin.close()


def test_exec_user_drives_the_cache_and_a_rotated_token_is_renewed_from_a_watch(tmp_path: Path) -> None:
    with start_cluster(tmp_path / "cluster", nodes=0, run_kubelet=False,
                       accepted_tokens=[TOKEN, "exec-1"]) as cluster:
        asyncio.run(exec_user_and_rotation(cluster, tmp_path))
