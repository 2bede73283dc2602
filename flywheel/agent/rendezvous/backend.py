"""`EtcdV3RendezvousBackend`: torch's DynamicRendezvousHandler state held in one etcd v3 key.

torch ships `etcd-v2` (the v2 HTTP API, removed from etcd 3.6 and off by default since 3.4) and `c10d` (a TCPStore
hosted by one of the workers, so it dies with that worker). This backend keeps the state in etcd v3, so the
rendezvous survives the loss of any worker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from aetcd import Client
from aetcd.exceptions import ClientError
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

from flywheel.etcd import keys
from flywheel.etcd.session import EtcdSession, EtcdUnavailableError

BACKEND_NAME = "etcd-v3"
T = TypeVar("T")


class EtcdV3RendezvousBackend(RendezvousBackend):
    """Rendezvous state in `/flywheel/rdzv/<run_id>/state`; the fencing token is the key's mod_revision.

    `set_state` is one transaction: compare mod_revision == token (or version == 0 when there is no token), put on
    success, read the current value on failure. A retry after a lost reply is safe: the compare then fails and the
    caller gets the (its own) current state with `False`, which DynamicRendezvousHandler handles by re-syncing.
    """

    def __init__(self, session: EtcdSession, run_id: str) -> None:
        self._session = session
        self._key = keys.state_key(run_id)

    @property
    def name(self) -> str:
        return BACKEND_NAME

    def get_state(self) -> tuple[bytes, Token] | None:
        async def read(client: Client) -> tuple[bytes, Token] | None:
            kv = await client.get(self._key)
            return None if kv is None else (kv.value, kv.mod_revision)

        return self._call(read)

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        if token is not None and not isinstance(token, int):
            # Not a token this backend issued, so it cannot match: report the current state, as the API asks.
            current = self.get_state()
            return None if current is None else (*current, False)

        async def compare_and_set(client: Client) -> tuple[bytes, Token, bool] | None:
            tx = client.transactions
            condition = tx.version(self._key) == 0 if token is None else tx.mod(self._key) == token
            succeeded, responses = await client.transaction(
                compare=[condition], success=[tx.put(self._key, state)], failure=[tx.get(self._key)]
            )
            if succeeded:
                return state, responses[0].response_put.header.revision, True
            found = responses[0]  # [(value, Get)] or [] when the key is gone (deleted by the operator)
            if not found:
                return None
            value, kv = found[0]
            return value, kv.mod_revision, False

        return self._call(compare_and_set)

    def _call(self, fn: Callable[[Client], Awaitable[T]]) -> T:
        try:
            return self._session.call(fn)
        except (EtcdUnavailableError, ClientError) as exc:
            raise RendezvousConnectionError(f"The connection to etcd has failed: {exc}") from exc
