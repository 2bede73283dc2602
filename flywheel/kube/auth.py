"""Where and how the operator and the REST API authenticate to the Kubernetes API, kept current (client.py's
transport and kopf's login read the same `Credentials`).

A kubeconfig is read by kubernetes_asyncio's loader: `exec` plugins (client.authentication.k8s.io/v1 and v1beta1),
token / tokenFile, client certificates, oidc, insecure-skip-tls-verify, proxy-url. `*-data` fields are written to one
private directory that `close()` removes. An exec token is fetched again shortly before its expirationTimestamp. In a
pod, the service-account token file is re-read whenever it changes (bound tokens rotate about hourly). Both are
renewed after a 401 (`renew()`).

Renewals are single-flight: concurrent requests that find the token due (or get a 401 with the same token) share
one run of the plugin. A plugin that answers with a token still inside EXPIRY_MARGIN (its own cache) is not run
again before that token really expires or gets a 401. After a failed renewal the plugin is not run again for
RENEW_BACKOFF seconds (doubling up to RENEW_BACKOFF_MAX); meanwhile callers get a `CredentialsError` naming the
failure once the token has expired, and the old token until then.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config.kube_config import KubeConfigLoader

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVED_AUTH_PROVIDERS = ("oidc",)  # gcp and azure were removed from kubectl (1.26); their exec plugins replace them
EXPIRY_MARGIN = timedelta(seconds=30)  # fetch an exec token again this long before it expires
RENEW_BACKOFF = 2.0  # seconds without a renewal after one failed, doubling per failure in a row ...
RENEW_BACKOFF_MAX = 60.0  # ... up to this
DATA_FIELDS = {"cluster": ("certificate-authority",), "user": ("client-certificate", "client-key")}


log = logging.getLogger(__name__)


class KubeConfigError(RuntimeError):
    """A kubeconfig or service account the operator cannot connect with; the message names the field and the fix."""


class CredentialsError(KubeConfigError):
    """Renewing the credentials failed (the exec plugin, the token file); the message says why and when it is tried
    again."""


@dataclass(frozen=True)
class Connection:
    """One resolved set of connection settings. `expiration`: when `token` stops being valid (exec plugins)."""

    server: str
    token: str | None = None
    ca_file: str | None = None
    insecure: bool = False
    cert_file: str | None = None
    key_file: str | None = None
    proxy: str | None = None
    expiration: datetime | None = None

    def transport(self) -> Connection:
        """What a TLS session is built from: all but the token (which goes in each request's header)."""
        return replace(self, token=None, expiration=None)


Renewer = Callable[[], Awaitable[Connection]]


class Credentials:
    """The current `Connection`, renewed when `due()` says so and after a 401; a fixed one is never renewed."""

    def __init__(self, conn: Connection, renewer: Renewer | None = None,
                 due: Callable[[Connection], bool] | None = None, temp_dir: Path | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.conn, self._renewer, self._due, self.temp_dir, self._clock = conn, renewer, due, temp_dir, clock
        self.renewals = 0  # renewals that succeeded
        self.runs = 0  # renewer runs, failed ones included
        self._lock = asyncio.Lock()
        self._held: Connection | None = None  # a renewal's answer that is itself due: kept until it expires
        self._failures = 0  # failed renewals in a row
        self._retry_at = 0.0  # (clock) no renewal before this after a failure
        self._failure = ""  # the last failure's message, while failing

    def _wants_renewal(self, conn: Connection) -> bool:
        if self._due is None or not self._due(conn):
            return False
        # The renewer just gave this one back: running it again would only give it back again.
        return conn is not self._held or _expired(conn)

    async def current(self) -> Connection:
        conn = self.conn
        if not self._wants_renewal(conn):
            return conn
        async with self._lock:
            if self.conn is conn:  # else renewed while this caller waited: use that
                try:
                    await self._run()
                except CredentialsError:
                    if _expired(conn):
                        raise
                    # still valid a while: used meanwhile (the failure is logged)
        return self.conn

    async def renew(self, used: Connection | None = None) -> bool:
        """Load the credentials again (after a 401 with `used`, the connection that request was sent with); True
        when they differ from `used` (the request is then worth retrying). A renewal done since `used` was read
        answers for it without running the renewer again."""
        if self._renewer is None:
            return False
        used = self.conn if used is None else used
        async with self._lock:
            if self.conn is not used:
                return self.conn != used
            await self._run()
            return self.conn != used

    async def _run(self) -> None:
        """One renewer run (the lock held); during a failure's back-off, the failure instead."""
        assert self._renewer is not None
        if self._failure and self._clock() < self._retry_at:
            raise CredentialsError(f"renewing the Kubernetes credentials failed {self._failures} time(s) in a row "
                                   f"(next try in {self._retry_at - self._clock():.1f}s): {self._failure}")
        self.runs += 1
        try:
            fresh = await self._renewer()
            if _expired(fresh):
                raise KubeConfigError(f"the credentials returned expired at {fresh.expiration}")
        except Exception as err:
            self._failures += 1
            delay = min(RENEW_BACKOFF_MAX, RENEW_BACKOFF * 2 ** (self._failures - 1))
            self._retry_at, self._failure = self._clock() + delay, str(err) or type(err).__name__
            error = CredentialsError(f"renewing the Kubernetes credentials failed {self._failures} time(s) in a row "
                                     f"(next try in {delay:g}s): {self._failure}")
            log.warning("%s", error)
            raise error from err
        self._failures, self._failure = 0, ""
        self.conn = replace(fresh)  # a new object even when equal: "renewed since" is identity
        self._held = self.conn if self._due is not None and self._due(self.conn) else None
        self.renewals += 1

    def close(self) -> None:
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


async def load_credentials(kubeconfig: str | None) -> Credentials:
    """From a kubeconfig's current context, else from the in-cluster service account."""
    if kubeconfig:
        return await from_kubeconfig(Path(kubeconfig))
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubeConfigError("no --kubeconfig (or $KUBECONFIG) given and not running in a cluster "
                              "($KUBERNETES_SERVICE_HOST is unset)")
    return service_account(SA_DIR, f"https://{host}:{port}")


def service_account(sa_dir: Path, server: str) -> Credentials:
    """The pod's service-account token, re-read whenever the file changes (the kubelet swaps it in place)."""
    token_file, ca_file = sa_dir / "token", sa_dir / "ca.crt"
    if not token_file.exists():
        raise KubeConfigError(f"{token_file} does not exist: mount the service account token "
                              "(automountServiceAccountToken: true) or pass --kubeconfig")
    seen: dict[str, int] = {}

    def read() -> Connection:
        seen["mtime"] = token_file.stat().st_mtime_ns
        return Connection(server, token_file.read_text().strip(), str(ca_file) if ca_file.exists() else None)

    async def renew() -> Connection:
        return read()

    def changed(_: Connection) -> bool:
        try:
            return token_file.stat().st_mtime_ns != seen["mtime"]
        except FileNotFoundError:  # mid-swap
            return False

    return Credentials(read(), renew, changed)


def _named(items: list[dict[str, Any]] | None, name: str | None, kind: str, path: Path) -> dict[str, Any]:
    for item in items or []:
        if item.get("name") == name:
            return dict(item.get(kind) or {})
    raise KubeConfigError(f"{path}: no {kind} named {name!r} (the current context refers to it)")


def check_user(path: Path, user_name: str, user: Mapping[str, Any]) -> None:
    """An auth method the operator cannot serve is an error, never a silently unauthenticated connection."""
    provider = (user.get("auth-provider") or {}).get("name")
    if provider is not None and provider not in SERVED_AUTH_PROVIDERS:
        raise KubeConfigError(
            f"{path}: user {user_name!r} uses auth-provider {provider!r}, which the operator cannot serve "
            f"(only {', '.join(SERVED_AUTH_PROVIDERS)}): switch that user to its exec credential plugin "
            "(e.g. gke-gcloud-auth-plugin, kubelogin) or a token")


def with_data_files(cfg: dict[str, Any], context: Mapping[str, Any], temp_dir: Path) -> dict[str, Any]:
    """`cfg` with the current cluster's and user's `X-data` fields written to files under `temp_dir` (as `X`)."""
    out = dict(cfg)
    for kind, key in (("cluster", "clusters"), ("user", "users")):
        entries = []
        for entry in out.get(key) or []:
            if entry.get("name") == context.get(kind):
                body = dict(entry.get(kind) or {})
                for field in DATA_FIELDS[kind]:
                    if body.get(f"{field}-data"):
                        target = temp_dir / f"{kind}-{field}"
                        target.write_bytes(base64.b64decode(body.pop(f"{field}-data")))
                        body[field] = str(target)
                entry = {**entry, kind: body}
            entries.append(entry)
        out[key] = entries
    return out


async def from_kubeconfig(path: Path) -> Credentials:
    cfg = yaml.safe_load(path.read_text()) or {}
    context_name = cfg.get("current-context")
    context = _named(cfg.get("contexts"), context_name, "context", path)
    user_name = context.get("user")
    user = _named(cfg.get("users"), user_name, "user", path) if user_name else {}
    check_user(path, str(user_name), user)
    cluster = _named(cfg.get("clusters"), context.get("cluster"), "cluster", path)
    # files only when there is something to write (a SIGKILLed operator cannot remove them): `*-data` fields, or an
    # exec plugin, which may answer with a client certificate
    needs_files = "exec" in user or any(f"{field}-data" in node for node, fields in
                                        ((cluster, DATA_FIELDS["cluster"]), (user, DATA_FIELDS["user"]))
                                        for field in fields)
    temp_dir = Path(tempfile.mkdtemp(prefix="flywheel-kube-")) if needs_files else None
    try:
        loader = KubeConfigLoader(config_dict=with_data_files(cfg, context, temp_dir) if temp_dir else cfg,
                                  config_base_path=str(path.resolve().parent),
                                  temp_file_path=str(temp_dir) if temp_dir else None)
        renew = _kubeconfig_renewer(loader)
        return Credentials(await renew(), renew, _expiring, temp_dir)
    except BaseException:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
        raise


def _kubeconfig_renewer(loader: KubeConfigLoader) -> Renewer:
    async def renew() -> Connection:
        if hasattr(loader, "exec_plugin_expiry"):
            del loader.exec_plugin_expiry  # the loader keeps an unexpired exec token; renewing means run it again
        configuration = Configuration()
        await loader.load_and_set(configuration)
        return _connection_of(configuration, getattr(loader, "exec_plugin_expiry", None))
    return renew


def _connection_of(configuration: Configuration, expiry: datetime | None) -> Connection:
    header = configuration.api_key.get("BearerToken")
    if header is not None and not str(header).startswith("Bearer "):
        raise KubeConfigError("the kubeconfig user authenticates with basic auth (username/password), removed in "
                              "Kubernetes 1.19: give it a token, client certificate or exec plugin")
    if expiry is not None and expiry.tzinfo is None:
        expiry = expiry.replace(tzinfo=UTC)
    return Connection(server=str(configuration.host), token=str(header)[7:].strip() if header else None,
                      ca_file=configuration.ssl_ca_cert, insecure=not configuration.verify_ssl,
                      cert_file=configuration.cert_file, key_file=configuration.key_file,
                      proxy=configuration.proxy, expiration=expiry)


def _expiring(conn: Connection) -> bool:
    return conn.expiration is not None and datetime.now(UTC) >= conn.expiration - EXPIRY_MARGIN


def _expired(conn: Connection) -> bool:
    return conn.expiration is not None and datetime.now(UTC) >= conn.expiration
