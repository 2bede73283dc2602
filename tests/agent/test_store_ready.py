"""A rank other than 0 connects to rank 0's store once it listens (agent/store_ready.py), instead of being refused
and backing off inside torch."""

from __future__ import annotations

import socket
import threading
import time

from flywheel.agent.store_ready import store_host, wait_for_store


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env(rank: str, port: int, **extra: str) -> dict[str, str]:
    return {"RANK": rank, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **extra}


def test_only_ranks_that_connect_to_rank_0s_store_wait() -> None:
    assert store_host(env("1", 29500)) == ("127.0.0.1", 29500)
    assert store_host(env("0", 29500)) is None  # it hosts the store
    assert store_host(env("1", 29500, TORCHELASTIC_USE_AGENT_STORE="True")) is None  # the agent's, listening
    assert store_host({"RANK": "1"}) is None  # no env:// rendezvous


def test_the_wait_ends_as_soon_as_the_store_listens() -> None:
    port = free_port()
    server = socket.socket()

    def listen_later() -> None:
        time.sleep(0.15)
        server.bind(("127.0.0.1", port))
        server.listen()

    threading.Thread(target=listen_later).start()
    try:
        waited = wait_for_store(env("1", port), timeout_s=10)
        assert 0.1 < waited < 0.5  # not before it listened, and well under torch's backoff
    finally:
        server.close()


def test_a_store_that_never_listens_gives_up_at_the_timeout() -> None:
    began = time.monotonic()
    waited = wait_for_store(env("2", free_port()), timeout_s=0.3)
    assert 0.3 <= waited < 1.0 and time.monotonic() - began < 1.0
