"""The operator's connection loader (flywheel/kube/auth.py) for each kubeconfig form and the in-cluster
service account: no I/O beyond temp files and a small exec plugin script."""

from __future__ import annotations

import asyncio
import base64
import os
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from flywheel.kube import auth as kube_auth
from flywheel.kube.auth import KubeConfigError, from_kubeconfig, load_credentials, service_account

EXEC_PLUGIN = '''
import json, pathlib, sys
here = pathlib.Path(sys.argv[0]).parent
runs = here / "runs"
runs.write_text(str(int(runs.read_text()) + 1) if runs.exists() else "1")
status = {"token": (here / "token").read_text().strip()}
if (here / "expires").exists():
    status["expirationTimestamp"] = (here / "expires").read_text().strip()
print(json.dumps({"apiVersion": sys.argv[1], "kind": "ExecCredential", "status": status}))
'''


def write_exec_plugin(directory: Path, token: str, expires: str | None = None) -> Path:
    """A plugin that prints an ExecCredential with the token in `directory/token`, counting its runs."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(token)
    if expires is not None:
        (directory / "expires").write_text(expires)
    script = directory / "plugin.py"
    script.write_text(EXEC_PLUGIN)
    return script


def exec_user(script: Path, api_version: str = "client.authentication.k8s.io/v1") -> dict[str, Any]:
    return {"exec": {"apiVersion": api_version, "command": sys.executable, "args": [str(script), api_version],
                     "interactiveMode": "Never"}}


def write_kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any], user_name: str = "me") -> Path:
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "ctx",
              "clusters": [{"name": "c", "cluster": cluster}, {"name": "other", "cluster": {"server": "http://x"}}],
              "users": [{"name": user_name, "user": user}],
              "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": user_name}}]}
    path.write_text(yaml.safe_dump(config))
    return path


def load(path: Path) -> kube_auth.Credentials:
    return asyncio.run(from_kubeconfig(path))


def test_token_user(tmp_path: Path) -> None:
    creds = load(write_kubeconfig(tmp_path / "kc", {"server": "http://127.0.0.1:1"}, {"token": "t0"}))
    assert (creds.conn.server, creds.conn.token, creds.conn.insecure) == ("http://127.0.0.1:1", "t0", False)
    assert creds.temp_dir is None  # nothing to write: no directory a SIGKILLed operator would leave behind
    creds.close()


def test_token_file_user_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("from-file\n")
    creds = load(write_kubeconfig(tmp_path / "kc", {"server": "http://h"}, {"tokenFile": "tok"}))
    assert creds.conn.token == "from-file"
    creds.close()


def test_data_fields_become_files_that_close_removes(tmp_path: Path) -> None:
    b64 = lambda text: base64.b64encode(text.encode()).decode()  # noqa: E731
    cluster = {"server": "https://h:6443", "certificate-authority-data": b64("CA PEM")}
    user = {"client-certificate-data": b64("CERT PEM"), "client-key-data": b64("KEY PEM")}
    creds = load(write_kubeconfig(tmp_path / "kc", cluster, user))
    conn = creds.conn
    assert conn.ca_file and conn.cert_file and conn.key_file
    assert [Path(f).read_text() for f in (conn.ca_file, conn.cert_file, conn.key_file)] == [
        "CA PEM", "CERT PEM", "KEY PEM"]
    assert creds.temp_dir is not None and Path(conn.ca_file).parent == creds.temp_dir
    creds.close()
    assert not creds.temp_dir.exists()


def test_file_paths_relative_to_the_kubeconfig_and_insecure(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("CA")
    creds = load(write_kubeconfig(tmp_path / "kc", {"server": "https://h", "certificate-authority": "ca.crt",
                                                    "insecure-skip-tls-verify": True}, {"token": "t"}))
    assert creds.conn.ca_file == str(tmp_path / "ca.crt") and creds.conn.insecure
    creds.close()


@pytest.mark.parametrize("api_version", ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"])
def test_exec_user(tmp_path: Path, api_version: str) -> None:
    script = write_exec_plugin(tmp_path / "plugin", "exec-token")
    creds = load(write_kubeconfig(tmp_path / "kc", {"server": "http://h"}, exec_user(script, api_version)))
    assert creds.conn.token == "exec-token" and creds.conn.expiration is None
    (tmp_path / "plugin" / "token").write_text("next-token")
    assert asyncio.run(creds.renew()) is True  # after a 401: the plugin runs again
    assert creds.conn.token == "next-token"
    creds.close()


def test_exec_token_fetched_again_before_it_expires(tmp_path: Path) -> None:
    soon = (datetime.now(UTC) + timedelta(seconds=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    script = write_exec_plugin(tmp_path / "plugin", "short-lived", expires=soon)
    creds = load(write_kubeconfig(tmp_path / "kc", {"server": "http://h"}, exec_user(script)))
    assert creds.conn.expiration is not None and creds.conn.expiration.tzinfo is not None
    later = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    (tmp_path / "plugin" / "expires").write_text(later)
    (tmp_path / "plugin" / "token").write_text("long-lived")
    conn = asyncio.run(creds.current())  # within EXPIRY_MARGIN of the expiry: runs the plugin again
    assert conn.token == "long-lived"
    runs = int((tmp_path / "plugin" / "runs").read_text())
    assert asyncio.run(creds.current()).token == "long-lived"
    assert int((tmp_path / "plugin" / "runs").read_text()) == runs  # valid for an hour: not run again
    creds.close()


def test_unservable_auth_provider_is_a_clear_error(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kc", {"server": "https://h"},
                            {"auth-provider": {"name": "azure", "config": {}}}, user_name="aks-admin")
    before = set(Path(tempfile.gettempdir()).glob("flywheel-kube-*"))
    with pytest.raises(KubeConfigError, match=r"user 'aks-admin' uses auth-provider 'azure'.*exec credential plugin"):
        load(path)
    assert set(Path(tempfile.gettempdir()).glob("flywheel-kube-*")) <= before  # no temp dir left behind


def test_basic_auth_is_a_clear_error(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kc", {"server": "http://h"}, {"username": "u", "password": "p"})
    with pytest.raises(KubeConfigError, match="basic auth"):
        load(path)


def test_missing_context_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "kc"
    path.write_text(yaml.safe_dump({"current-context": "nope", "contexts": [], "clusters": [], "users": []}))
    with pytest.raises(KubeConfigError, match=r"no context named 'nope'"):
        load(path)


def test_service_account_token_reread_when_the_file_changes(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sa-1")
    (tmp_path / "ca.crt").write_text("CA")
    creds = service_account(tmp_path, "https://10.0.0.1:443")
    assert (creds.conn.token, creds.conn.ca_file) == ("sa-1", str(tmp_path / "ca.crt"))
    stat = (tmp_path / "token").stat()
    (tmp_path / "token").write_text("sa-2")
    os.utime(tmp_path / "token", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert asyncio.run(creds.current()).token == "sa-2"
    (tmp_path / "token").write_text("sa-3")  # same mtime (coarse clock): only a 401's renew() sees it
    os.utime(tmp_path / "token", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert asyncio.run(creds.current()).token == "sa-2"
    assert asyncio.run(creds.renew()) is True and creds.conn.token == "sa-3"


def test_no_kubeconfig_outside_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match="--kubeconfig"):
        asyncio.run(load_credentials(None))


def test_in_cluster_reads_the_service_account_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "token").write_text("sa")
    monkeypatch.setattr(kube_auth, "SA_DIR", tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    creds = asyncio.run(load_credentials(None))
    assert (creds.conn.server, creds.conn.token) == ("https://10.96.0.1:443", "sa")


class Plugin:
    """A renewer counting its runs: answers with `token` valid for `valid` seconds, or raises `error`."""

    def __init__(self, token: str, valid: float, error: Exception | None = None) -> None:
        self.token, self.valid, self.error, self.runs = token, valid, error, 0

    async def __call__(self) -> kube_auth.Connection:
        self.runs += 1
        await asyncio.sleep(0.01)  # the subprocess: concurrent callers overlap it
        if self.error is not None:
            raise self.error
        return kube_auth.Connection("https://k", self.token,
                                    expiration=datetime.now(UTC) + timedelta(seconds=self.valid))


def expiring_in(seconds: float, token: str = "old") -> kube_auth.Connection:
    return kube_auth.Connection("https://k", token, expiration=datetime.now(UTC) + timedelta(seconds=seconds))


def test_concurrent_requests_at_expiry_share_one_renewal() -> None:
    plugin = Plugin("new", 900)
    creds = kube_auth.Credentials(expiring_in(-1), plugin, kube_auth._expiring)

    async def scenario() -> set[str | None]:
        return {c.token for c in await asyncio.gather(*(creds.current() for _ in range(50)))}
    assert asyncio.run(scenario()) == {"new"} and plugin.runs == 1


def test_concurrent_401s_with_one_token_share_one_renewal() -> None:
    plugin = Plugin("new", 900)
    used = expiring_in(900)
    creds = kube_auth.Credentials(used, plugin, kube_auth._expiring)

    async def scenario() -> list[bool]:
        return list(await asyncio.gather(*(creds.renew(used) for _ in range(20))))
    assert asyncio.run(scenario()) == [True] * 20 and plugin.runs == 1
    asyncio.run(creds.renew(creds.conn))
    assert plugin.runs == 2  # a 401 with the new token: the plugin runs again


def test_a_token_the_plugin_gives_back_inside_the_margin_is_used_until_it_expires() -> None:
    plugin = Plugin("cached", 20)  # the plugin's own cache: valid 20 s more, inside EXPIRY_MARGIN
    creds = kube_auth.Credentials(expiring_in(20, "cached"), plugin, kube_auth._expiring)

    async def scenario() -> None:
        for _ in range(10):
            assert (await creds.current()).token == "cached"
    asyncio.run(scenario())
    assert plugin.runs == 1
    creds.conn = kube_auth.replace(creds.conn, expiration=datetime.now(UTC) - timedelta(seconds=1))
    creds._held = creds.conn  # the held token, now really expired: renewed again
    plugin.valid = 900
    assert asyncio.run(creds.current()).token == "cached" and plugin.runs == 2


def test_a_failing_plugin_backs_off_and_callers_get_a_clear_error() -> None:
    now = [0.0]
    plugin = Plugin("new", 900, error=RuntimeError("exec: gke-gcloud-auth-plugin: not logged in"))
    creds = kube_auth.Credentials(expiring_in(-1), plugin, kube_auth._expiring, clock=lambda: now[0])

    async def attempt() -> str:
        with pytest.raises(kube_auth.CredentialsError) as caught:
            await creds.current()
        return str(caught.value)

    async def scenario() -> None:
        messages = await asyncio.gather(*(attempt() for _ in range(20)))
        assert plugin.runs == 1 and all("not logged in" in m for m in messages)
        with pytest.raises(kube_auth.CredentialsError, match="not logged in"):
            await creds.renew()  # a 401 during the back-off: the failure, not another run
        now[0] += kube_auth.RENEW_BACKOFF
        await attempt()
        assert plugin.runs == 2
        now[0] += kube_auth.RENEW_BACKOFF  # the second back-off is twice as long
        await attempt()
        assert plugin.runs == 2
        now[0] += kube_auth.RENEW_BACKOFF
        plugin.error = None
        assert (await creds.current()).token == "new" and plugin.runs == 3
    asyncio.run(scenario())


def test_a_failed_renewal_keeps_a_token_that_is_still_valid() -> None:
    plugin = Plugin("new", 900, error=RuntimeError("plugin crashed"))
    creds = kube_auth.Credentials(expiring_in(20), plugin, kube_auth._expiring)

    async def scenario() -> None:
        for _ in range(5):
            assert (await creds.current()).token == "old"
    asyncio.run(scenario())
    assert plugin.runs == 1
