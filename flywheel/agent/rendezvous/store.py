"""`EtcdStore`: a torch.distributed.Store on etcd v3, the store DynamicRendezvousHandler hands to the agents.

The agents use it after every rendezvous round (rank 0 publishes MASTER_ADDR/MASTER_PORT for the workers' own
TCPStore, role infos and assigned ranks go through multi_set/multi_get) and for the exit barrier (add + wait). It
must not live in any one worker, so it lives in etcd next to the rendezvous state.

Keys are `/flywheel/rdzv/<run_id>/store/<key>`, each attached to a lease of the agent that wrote it (kept alive by
the session's loop, not revoked on exit: another agent may still be waiting for a barrier key). Keys of agents that
are gone expire after `lease_ttl`, so rounds do not pile keys up; the operator's `delete_run` removes the rest.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TypeVar

import torch.distributed as dist
from aetcd import Client
from aetcd.exceptions import ClientError, WatchTimeoutError
from torch.distributed.distributed_c10d import Store

from flywheel.etcd import keys
from flywheel.etcd.session import EtcdSession, EtcdUnavailableError

DEFAULT_STORE_TIMEOUT = timedelta(seconds=300)
DEFAULT_STORE_LEASE_TTL = 30

StoreValue = str | bytes
T = TypeVar("T")


def _as_bytes(value: StoreValue) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


class EtcdStore(Store):
    timeout: timedelta  # the pybind property behind set_timeout (missing from torch's type stub)

    def __init__(
        self,
        session: EtcdSession,
        run_id: str,
        *,
        lease_ttl: int = DEFAULT_STORE_LEASE_TTL,
        timeout: timedelta = DEFAULT_STORE_TIMEOUT,
    ) -> None:
        super().__init__()  # required by the pybind trampoline
        self.set_timeout(timeout)
        self._session = session
        self._prefix = keys.store_prefix(run_id)
        self._commit_prefix = keys.commit_marker_prefix(run_id)
        self._lease = session.start_lease(lease_ttl)

    # -- the Store API --------------------------------------------------------------------------------------------

    def set(self, key: StoreValue, value: StoreValue) -> None:
        k, v = self._key(key), _as_bytes(value)
        self._call(lambda c: c.put(k, v, lease=self._lease.lease_id))

    def get(self, key: StoreValue) -> bytes:
        """The value of `key`, waiting up to the store timeout for it to be set."""
        k = self._key(key)
        deadline = time.monotonic() + self.timeout.total_seconds()
        while True:
            self._wait_until(deadline, [k], what=f"key {key!r}")
            kv = self._call(lambda c: c.get(k))
            if kv is not None:
                value: bytes = kv.value
                return value

    def add(self, key: StoreValue, amount: int) -> int:
        """Atomically add to a decimal counter (missing = 0) and return the new value, as TCPStore does."""
        new = self._read_modify_write(self._key(key), lambda old: str(int(old or b"0") + amount).encode())
        return int(new)

    def append(self, key: StoreValue, value: StoreValue) -> None:
        suffix = _as_bytes(value)
        self._read_modify_write(self._key(key), lambda old: (old or b"") + suffix)

    def compare_set(self, key: StoreValue, expected_value: StoreValue, desired_value: StoreValue) -> bytes:
        """Set `desired` if the value is `expected` (or the key is missing and `expected` is empty).

        Returns `desired` on success, else the current value (or `expected` when the key is missing), as TCPStore.
        """
        k, expected, desired = self._key(key), _as_bytes(expected_value), _as_bytes(desired_value)

        async def compare_and_set(client: Client) -> bytes:
            tx = client.transactions
            condition = tx.version(k) == 0 if expected == b"" else tx.value(k) == expected
            succeeded, responses = await client.transaction(
                compare=[condition],
                success=[tx.put(k, desired, lease=self._lease.lease_id)],
                failure=[tx.get(k)],
            )
            if succeeded:
                return desired
            found = responses[0]
            return found[0][0] if found else expected

        return self._call(compare_and_set)

    def check(self, keys: Sequence[StoreValue]) -> bool:
        """Whether all keys are set now (no waiting)."""
        return not self._call(self._missing_and_revision([self._key(k) for k in keys]))[0]

    def wait(self, keys: Sequence[StoreValue], timeout: timedelta | None = None) -> None:
        """Block until all keys are set; DistStoreError after `timeout` (default: the store timeout)."""
        seconds = (timeout or self.timeout).total_seconds()
        self._wait_until(time.monotonic() + seconds, [self._key(k) for k in keys], what=f"keys {list(keys)!r}")

    def delete_key(self, key: StoreValue) -> bool:
        k = self._key(key)
        return self._call(lambda c: c.delete(k)) is not None

    def num_keys(self) -> int:
        async def count(client: Client) -> int:
            count: int = (await client.get_prefix(self._prefix, keys_only=True)).count
            return count

        return self._call(count)

    def multi_get(self, keys: Sequence[StoreValue]) -> list[bytes]:
        wanted = [self._key(k) for k in keys]
        deadline = time.monotonic() + self.timeout.total_seconds()
        while True:
            self._wait_until(deadline, wanted, what=f"keys {list(keys)!r}")

            async def read_all(client: Client) -> list[bytes] | None:
                _, responses = await client.transaction(
                    compare=[], success=[client.transactions.get(k) for k in wanted], failure=[]
                )
                return None if any(not r for r in responses) else [r[0][0] for r in responses]

            values = self._call(read_all)
            if values is not None:  # else a key was deleted between the wait and the read: wait again
                return values

    def multi_set(self, keys: Sequence[StoreValue], values: Sequence[StoreValue]) -> None:
        puts = [(self._key(k), _as_bytes(v)) for k, v in zip(keys, values, strict=True)]

        async def put_all(client: Client) -> None:
            ops = [client.transactions.put(k, v, lease=self._lease.lease_id) for k, v in puts]
            await client.transaction(compare=[], success=ops, failure=[])

        self._call(put_all)

    def has_extended_api(self) -> bool:
        return True

    # The pybind trampoline looks these two up by their C++ names when a PrefixStore forwards to this store.
    getNumKeys = num_keys
    deleteKey = delete_key

    def close(self) -> None:
        """Stop refreshing this store's lease (its keys then expire after the lease TTL)."""
        self._lease.stop()

    # -- helpers --------------------------------------------------------------------------------------------------

    def _key(self, key: StoreValue) -> bytes:
        return self._prefix + _as_bytes(key)

    def _call(self, fn: Callable[[Client], Awaitable[T]]) -> T:
        try:
            return self._session.call(fn)
        except (EtcdUnavailableError, ClientError) as exc:
            raise dist.DistStoreError(f"etcd store: {exc}") from exc

    def _missing_and_revision(
        self, wanted: list[bytes]
    ) -> Callable[[Client], Awaitable[tuple[bytes | None, int]]]:
        """A request: the first missing key and the revision it was read at, or (None, revision)."""

        async def first_missing(client: Client) -> tuple[bytes | None, int]:
            revision = 0
            for k in wanted:
                found = await client.get_range(k, k + b"\0")
                revision = found.header.revision
                if not found:
                    return k, revision
            return None, revision

        return first_missing

    def _wait_until(self, deadline: float, wanted: list[bytes], what: str) -> None:
        try:
            done = self._session.run(self._wait_async(deadline, wanted))
        except (EtcdUnavailableError, ClientError) as exc:
            raise dist.DistStoreError(f"etcd store: waiting for {what}: {exc}") from exc
        if not done:
            raise dist.DistStoreError(f"etcd store: timed out waiting for {what}")

    async def _wait_async(self, deadline: float, wanted: list[bytes]) -> bool:
        """Re-check, then watch the first missing key from just after the revision it was seen missing at.

        Watching from that revision cannot miss a put that lands between the read and the watch. Each watch is
        bounded by the RPC timeout, so a watch stream broken by an etcd restart only costs one re-check.
        """
        session = self._session
        while True:
            missing, revision = await session.call_async(self._missing_and_revision(wanted))
            if missing is None:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                result = await session.client.watch_once(
                    missing, timeout=min(remaining, session.rpc_timeout), start_revision=revision + 1
                )
                if isinstance(result, Exception):  # the watch stream broke; back off briefly and re-check
                    await asyncio.sleep(0.1)
            except WatchTimeoutError:
                pass
            except ClientError:
                await asyncio.sleep(0.1)

    def _read_modify_write(self, key: bytes, update: Callable[[bytes | None], bytes]) -> bytes:
        """CAS loop. A commit marker written in the same transaction makes a retry after a lost reply see that the
        first attempt committed, so `add` is applied exactly once."""
        marker = self._commit_prefix + uuid.uuid4().hex.encode()

        async def attempt(client: Client) -> bytes:
            tx = client.transactions
            while True:
                committed = await client.get(marker)
                if committed is not None:
                    value: bytes = committed.value
                    return value
                current = await client.get(key)
                new = update(None if current is None else current.value)
                condition = tx.version(key) == 0 if current is None else tx.mod(key) == current.mod_revision
                lease = self._lease.lease_id
                succeeded, _ = await client.transaction(
                    compare=[condition],
                    success=[tx.put(key, new, lease=lease), tx.put(marker, new, lease=lease)],
                    failure=[],
                )
                if succeeded:
                    return new
                await asyncio.sleep(random.uniform(0, 0.02))  # contention: let the other writer finish

        new_value = self._call(attempt)
        self._session.submit(_delete_quietly(self._session, marker))
        return new_value


async def _delete_quietly(session: EtcdSession, key: bytes) -> None:
    try:
        await session.client.delete(key)
    except Exception:  # noqa: BLE001 - the marker is under a lease and expires anyway
        pass
