"""Wiring for a served API: the product's Kubernetes client (flywheel/kube: a kubeconfig, exec plugins included, or
the in-cluster rotating service-account token), the watch-backed cache, the authenticator and the actions, all on
the serving event loop. Used by `flywheel api`, `flywheel operator --api-port` and `uvicorn flywheel.api.app:app`
(environment)."""

from __future__ import annotations

import asyncio
import getpass
import os
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flywheel.api.auth import TokenFileAuth

DEFAULT_PORT = 8700


@dataclass
class ServerConfig:
    kubeconfig: str | None = None  # None: $KUBECONFIG, else in-cluster
    namespace: str | None = None  # None: all namespaces
    token_file: str | None = None  # set: static tokens instead of TokenReview/SubjectAccessReview
    read_only: bool = False
    etcd_endpoints: str = ""  # set: step, checkpoint and goodput of running jobs from the etcd progress (progress.py)

    @classmethod
    def from_env(cls) -> ServerConfig:
        return cls(kubeconfig=os.environ.get("FLYWHEEL_KUBECONFIG") or os.environ.get("KUBECONFIG") or None,
                   namespace=os.environ.get("FLYWHEEL_API_NAMESPACE") or None,
                   token_file=os.environ.get("FLYWHEEL_API_TOKEN_FILE") or None,
                   read_only=os.environ.get("FLYWHEEL_API_READ_ONLY", "") in ("1", "true", "yes"),
                   etcd_endpoints=os.environ.get("FLYWHEEL_ETCD_ENDPOINTS", ""))


async def attach(app: Any, cfg: ServerConfig, wait_seconds: float = 30.0) -> Callable[[], Awaitable[None]]:
    """Fill app.state with a started cache, auth and actions (on the running event loop); returns the coroutine
    function that stops them."""
    from flywheel.api.auth import KubeAuth
    from flywheel.api.cache import KubeCache
    from flywheel.api.job_actions import KubeActions
    from flywheel.kube.client import Kube, load_credentials

    kube = Kube(await load_credentials(cfg.kubeconfig))  # None: in-cluster (ServerConfig.from_env reads $KUBECONFIG)
    auth = TokenFileAuth.from_file(cfg.token_file) if cfg.token_file else KubeAuth(kube)
    cache = KubeCache(kube, cfg.namespace).start()
    await cache.wait_synced(wait_seconds)  # /readyz stays 503 until it has; the server starts either way
    app.state.source, app.state.auth = cache, auth
    app.state.actions = None if cfg.read_only else KubeActions(kube)
    progress = None
    if cfg.etcd_endpoints:
        from flywheel.api.progress import ProgressFollower

        progress = app.state.progress = ProgressFollower(cfg.etcd_endpoints, cache.jobs, time.time).start()

    async def stop() -> None:
        if progress is not None:
            await asyncio.to_thread(progress.stop)  # joins its thread: off the serving loop
        await cache.stop()
        await kube.close()

    return stop


async def from_env(app: Any) -> Callable[[], Awaitable[None]]:
    return await attach(app, ServerConfig.from_env())


class ThreadedServer:
    """uvicorn in a background thread (for `flywheel run --api-port`); signals stay with the main thread."""

    def __init__(self, app: Any, host: str, port: int) -> None:
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        self._thread = threading.Thread(target=self.server.run, name="flywheel-api", daemon=True)

    def start(self, timeout: float = 15.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the API server did not start (is the port free?)")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(10)


def local_token_files(out: Path, token: str | None = None) -> tuple[Path, Path]:
    """A fresh token for a local run: `<out>/api-token` (for `flywheel status --token-file`) and the server's
    `<out>/api-tokens.csv`, both readable by the owner only."""
    token = token or secrets.token_urlsafe(24)
    out.mkdir(parents=True, exist_ok=True)
    raw, table = out / "api-token", out / "api-tokens.csv"
    for path, text in ((raw, token + "\n"), (table, f"{token},{getpass.getuser()},local\n")):
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(text)
    return raw, table
