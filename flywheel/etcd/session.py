"""A synchronous face on the asyncio etcd v3 client `aetcd`.

torch's rendezvous backend and Store APIs are synchronous and are called from several threads (the agent's main
loop, the rendezvous keep-alive timer, worker processes never). aetcd is asyncio-only, so each `EtcdSession` runs
one aetcd client on a private event loop in a daemon thread and hands coroutines to it. The session also keeps
leases alive from that loop, so no extra thread is needed per lease.

This module imports neither torch nor anything else heavy: the operator uses it through `flywheel.etcd.liveness`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_ETCD_PORT = 2379

# Errors after which the same request may be sent again (to the same or the next endpoint). Every write this
# package makes is a compare-and-swap or idempotent, so a retry after an unknown outcome is safe.
RETRYABLE_ERRORS: tuple[type[BaseException], ...] = (
    aetcd.exceptions.ConnectionFailedError,
    aetcd.exceptions.ConnectionTimeoutError,
    asyncio.TimeoutError,
)

# Reconnect quickly after an etcd restart; gRPC's default backoff grows to two minutes.
_GRPC_CHANNEL_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
}


class EtcdUnavailableError(ConnectionError):
    """No etcd endpoint answered within the session's retry window."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoints(spec: str) -> list[Endpoint]:
    """Parse "host:port[,host:port...]" (an optional http:// scheme and a missing port are tolerated)."""
    endpoints: list[Endpoint] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        for scheme in ("http://", "https://"):
            if item.startswith(scheme):
                item = item[len(scheme) :]
        item = item.rstrip("/")
        if item.startswith("["):  # [ipv6]:port
            host, _, rest = item[1:].partition("]")
            port = int(rest[1:]) if rest.startswith(":") else DEFAULT_ETCD_PORT
        elif item.count(":") == 1:
            host, port_text = item.split(":")
            port = int(port_text)
        else:
            host, port = item, DEFAULT_ETCD_PORT
        endpoints.append(Endpoint(host, port))
    if not endpoints:
        raise ValueError(f"no etcd endpoint in {spec!r}")
    return endpoints


class EtcdSession:
    """One etcd client on a private event-loop thread, with endpoint failover and bounded retries.

    `call(fn)` runs `fn(client)` on the loop and returns its result to the calling thread. Retryable errors are
    retried (moving to the next endpoint each time) until `retry_seconds` have passed; then `EtcdUnavailableError`.
    """

    def __init__(
        self,
        endpoints: str | list[Endpoint],
        *,
        rpc_timeout: float = 5.0,
        retry_seconds: float = 30.0,
        name: str = "flywheel-etcd",
    ) -> None:
        self.endpoints = parse_endpoints(endpoints) if isinstance(endpoints, str) else list(endpoints)
        self.rpc_timeout = rpc_timeout
        self.retry_seconds = retry_seconds
        self._endpoint_index = 0
        self._generation = 0
        self._closed = False
        self._retired: list[aetcd.Client] = []
        self.prefix_hubs: dict[bytes, Any] = {}  # key root -> its shared watch (prefix_watch.PrefixHub), per session
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._client: aetcd.Client = self.run(self._new_client())

    # -- running coroutines -------------------------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def client(self) -> aetcd.Client:
        """The current client (for use on the loop only; it is replaced when its endpoint fails)."""
        return self._client

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the session's loop and wait for its result in the calling thread."""
        if self.in_loop_thread():
            raise RuntimeError("EtcdSession.run called from its own loop thread (would deadlock)")
        if self._loop.is_closed():  # e.g. a keep-alive timer firing after the atexit cleanup
            raise EtcdUnavailableError("the etcd session is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start a coroutine on the loop without waiting (background tasks: lease keepers, watches)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def call(self, fn: Callable[[aetcd.Client], Awaitable[T]]) -> T:
        """Run `fn(client)` with retries and failover; the synchronous entry point for backend and store."""
        return self.run(self.call_async(fn))

    async def call_async(self, fn: Callable[[aetcd.Client], Awaitable[T]]) -> T:
        deadline = time.monotonic() + self.retry_seconds
        delay = 0.05
        while True:
            client, generation = self._client, self._generation
            try:
                return await asyncio.wait_for(fn(client), self.rpc_timeout * 2)
            except RETRYABLE_ERRORS as exc:
                if self._closed or time.monotonic() + delay > deadline:
                    raise EtcdUnavailableError(
                        f"etcd at {','.join(map(str, self.endpoints))} unavailable for {self.retry_seconds:.0f} s: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                log.debug("etcd request failed (%s: %s); retrying in %.2f s", type(exc).__name__, exc, delay)
                await self._replace_client(generation)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _new_client(self) -> aetcd.Client:
        endpoint = self.endpoints[self._endpoint_index % len(self.endpoints)]
        client = aetcd.Client(
            host=endpoint.host,
            port=endpoint.port,
            timeout=self.rpc_timeout,
            options=dict(_GRPC_CHANNEL_OPTIONS),
        )
        await client.connect()
        return client

    async def _replace_client(self, failed_generation: int) -> None:
        """Move to the next endpoint with a fresh channel, once per failure however many callers saw it."""
        if failed_generation != self._generation or self._closed:
            return
        self._generation += 1
        self._endpoint_index += 1
        old = self._client
        self._client = await self._new_client()
        # Close the old channel later: requests still in flight on it should fail or finish by themselves.
        self._retired.append(old)
        self._loop.call_later(self.rpc_timeout * 2 + 1, lambda: self._loop.create_task(self._retire(old)))

    async def _retire(self, client: aetcd.Client) -> None:
        if client in self._retired:
            self._retired.remove(client)
            await _close_quietly(client)

    # -- leases ---------------------------------------------------------------------------------------------------

    def start_lease(
        self, ttl: int, on_new_lease: Callable[[int], Awaitable[None]] | None = None
    ) -> "KeptLease":
        """Grant a lease and keep it alive from the loop; `on_new_lease(id)` (re)attaches keys after a re-grant."""
        kept = KeptLease(self, ttl, on_new_lease)
        self.run(kept.grant())
        kept.task = self.submit(kept.keep_alive())
        return kept

    # -- shutdown -------------------------------------------------------------------------------------------------

    def __enter__(self) -> "EtcdSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Cancel background tasks (lease keepers, watches), close the channels and end the loop thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self.run(self._shutdown(), timeout=self.rpc_timeout)
        except Exception:  # noqa: BLE001 - best effort at shutdown
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=self.rpc_timeout)
        if not self._thread.is_alive():
            self._loop.close()

    async def _shutdown(self) -> None:
        current = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for client in [*self._retired, self._client]:
            await _close_quietly(client)


class KeptLease:
    """A lease refreshed every ttl/3 seconds. If etcd forgot it (expired during an outage), a new one is granted
    and `on_new_lease` re-attaches the keys, so a worker that comes back is visible again."""

    def __init__(
        self, session: EtcdSession, ttl: int, on_new_lease: Callable[[int], Awaitable[None]] | None
    ) -> None:
        self.session = session
        self.ttl = ttl
        self.lease_id = 0
        self.task: concurrent.futures.Future[None] | None = None
        self._on_new_lease = on_new_lease
        self._stopped = False

    async def grant(self) -> None:
        lease = await self.session.call_async(lambda c: c.lease(self.ttl))
        self.lease_id = lease.id
        if self._on_new_lease is not None:
            await self._on_new_lease(self.lease_id)

    async def keep_alive(self) -> None:
        interval = max(self.ttl / 3.0, 0.2)
        while not self._stopped:
            await asyncio.sleep(interval)
            try:
                reply = await self.session.call_async(lambda c: c.refresh_lease(self.lease_id))
                if reply is None or reply.TTL <= 0:
                    log.warning("etcd lease %x was lost; granting a new one", self.lease_id)
                    await self.grant()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep trying for as long as the process lives
                log.warning("etcd lease %x keep-alive failed: %s", self.lease_id, exc)

    def revoke(self) -> None:
        """Stop refreshing and delete the lease (its keys disappear at once)."""
        self._stopped = True
        if self.task is not None:
            self.task.cancel()
        lease_id = self.lease_id
        try:
            self.session.run(
                asyncio.wait_for(self.session.client.revoke_lease(lease_id), self.session.rpc_timeout),
                timeout=self.session.rpc_timeout + 1,
            )
        except Exception as exc:  # noqa: BLE001 - the lease then expires by its TTL
            log.debug("revoking etcd lease %x failed: %s", lease_id, exc)

    def stop(self) -> None:
        """Stop refreshing without revoking (keys then expire after the TTL)."""
        self._stopped = True
        if self.task is not None:
            self.task.cancel()


async def _close_quietly(client: aetcd.Client) -> None:
    try:
        await client.close()
    except Exception:  # noqa: BLE001 - closing a broken channel may fail; nothing to do about it
        pass
