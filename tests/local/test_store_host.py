"""flywheel/local/store_host.py: the port is known before the store serves, and an agent that connects that early
is served once it does."""

from __future__ import annotations

import threading
from datetime import timedelta

import torch.distributed as dist

from flywheel.local.store_host import HOST, StoreHost


def test_a_client_that_connects_first_is_served_once_the_store_is_up():
    host = StoreHost()
    got: dict[str, bytes] = {}

    def agent() -> None:
        client = dist.TCPStore(HOST, host.port, is_master=False, timeout=timedelta(seconds=30))
        client.set("round", "1")
        got["round"] = client.get("round")

    thread = threading.Thread(target=agent)
    thread.start()
    store = host.store()
    thread.join(timeout=60)
    assert got == {"round": b"1"} and store.get("round") == b"1" and store.port == host.port
    host.close()
