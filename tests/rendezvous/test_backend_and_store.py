"""The etcd-v3 rendezvous backend and the etcd Store against a real etcd."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

from flywheel.agent.rendezvous.backend import EtcdV3RendezvousBackend
from flywheel.agent.rendezvous.store import EtcdStore
from flywheel.etcd.liveness import delete_run
from flywheel.etcd.session import Endpoint, EtcdSession, EtcdUnavailableError, parse_endpoints

from .etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def sessions(etcd_server: EtcdServer) -> Iterator[tuple[EtcdSession, EtcdSession]]:
    """Two independent clients, as two agents would have."""
    a, b = EtcdSession(etcd_server.endpoint), EtcdSession(etcd_server.endpoint)
    yield a, b
    a.close()
    b.close()


def test_parse_endpoints() -> None:
    assert parse_endpoints("etcd-0.etcd:2379, http://10.0.0.2:2380/,etcd-2") == [
        Endpoint("etcd-0.etcd", 2379),
        Endpoint("10.0.0.2", 2380),
        Endpoint("etcd-2", 2379),
    ]
    with pytest.raises(ValueError):
        parse_endpoints(" , ")


def test_set_state_is_compare_and_set_on_mod_revision(sessions: tuple[EtcdSession, EtcdSession]) -> None:
    one, two = (EtcdV3RendezvousBackend(s, "run-cas") for s in sessions)
    assert one.name == "etcd-v3"
    assert one.get_state() is None

    state, token, ok = one.set_state(b"first")  # type: ignore[misc]
    assert (state, ok) == (b"first", True)
    # No token = create only: the second agent gets the existing state back.
    assert two.set_state(b"second") == (b"first", token, False)

    newer = two.set_state(b"second", token)
    assert newer is not None and newer[0] == b"second" and newer[2] is True and newer[1] > token
    # A stale token loses and learns the newer state and its token.
    assert one.set_state(b"third", token) == (b"second", newer[1], False)
    assert one.get_state() == (b"second", newer[1])
    # A token this backend never issued cannot match.
    assert one.set_state(b"x", "not-a-revision") == (b"second", newer[1], False)

    # After the operator deleted the run, a token-guarded write finds nothing.
    assert delete_run(sessions[0], "run-cas") >= 1
    assert one.set_state(b"late", newer[1]) is None
    assert one.get_state() is None


def test_concurrent_set_state_has_exactly_one_winner(sessions: tuple[EtcdSession, EtcdSession]) -> None:
    backends = [EtcdV3RendezvousBackend(sessions[i % 2], "run-race") for i in range(6)]
    _, token = backends[0].set_state(b"base")[:2]  # type: ignore[index]
    barrier = threading.Barrier(len(backends))
    results: list[tuple[bytes, object, bool] | None] = [None] * len(backends)

    def write(i: int) -> None:
        barrier.wait()
        results[i] = backends[i].set_state(f"writer-{i}".encode(), token)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(backends))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if r is not None and r[2]]
    assert len(winners) == 1
    assert all(r is not None and r[:2] == winners[0][:2] for r in results)


def test_store_set_get_wait_check_delete(sessions: tuple[EtcdSession, EtcdSession]) -> None:
    store = EtcdStore(sessions[0], "run-store", timeout=timedelta(seconds=2))
    other = EtcdStore(sessions[1], "run-store")
    store.set("a", "1")
    store.set(b"raw", b"\x00\xff")
    assert other.get("a") == b"1" and other.get("raw") == b"\x00\xff"
    assert store.check(["a", "raw"]) and not store.check(["a", "missing"])

    # get blocks until another agent sets the key; the watch wakes it promptly.
    threading.Timer(0.3, lambda: other.set("late", "here")).start()
    began = time.monotonic()
    assert store.get("late") == b"here"
    assert 0.25 < time.monotonic() - began < 1.5

    began = time.monotonic()
    with pytest.raises(dist.DistStoreError):
        store.wait(["never"], timedelta(seconds=0.5))
    assert 0.45 < time.monotonic() - began < 1.5
    with pytest.raises(dist.DistStoreError):  # the store timeout (2 s) bounds get
        store.get("never")

    threading.Timer(0.2, lambda: other.multi_set(["m1", "m2"], ["x", "y"])).start()
    store.wait(["m1", "m2"])
    assert store.multi_get(["m2", "m1"]) == [b"y", b"x"]

    assert store.num_keys() == 5
    assert store.delete_key("a") is True and store.delete_key("a") is False
    assert store.num_keys() == 4


def test_store_add_and_compare_set(sessions: tuple[EtcdSession, EtcdSession]) -> None:
    stores = [EtcdStore(s, "run-add") for s in sessions]
    assert stores[0].add("n", 5) == 5
    assert stores[1].add("n", -2) == 3
    assert stores[0].get("n") == b"3"

    # Concurrent adds from two agents (two clients, four threads) lose nothing and never repeat a value.
    seen: list[int] = []
    lock = threading.Lock()

    def add_many(store: EtcdStore) -> None:
        for _ in range(15):
            value = store.add("counter", 1)
            with lock:
                seen.append(value)

    threads = [threading.Thread(target=add_many, args=(stores[i % 2],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == list(range(1, 61))

    store = stores[0]
    assert store.compare_set("cs", "", "created") == b"created"  # missing + expected "" -> set
    assert store.compare_set("cs", "wrong", "x") == b"created"  # mismatch -> current value
    assert store.compare_set("cs", "created", "swapped") == b"swapped"
    assert store.compare_set("absent", "something", "x") == b"something"  # missing + expected set -> expected
    assert not store.check(["absent"])
    store.append("log", "ab")
    store.append("log", "cd")
    assert store.get("log") == b"abcd"


def test_store_through_prefix_store(sessions: tuple[EtcdSession, EtcdSession]) -> None:
    """DynamicRendezvousHandler wraps the store in a PrefixStore per round; the C++ side must reach every method."""
    etcd_store = EtcdStore(sessions[0], "run-prefix")  # keep a Python reference: the trampoline needs the object
    store = dist.PrefixStore("torch.rendezvous.run.1", etcd_store)
    store.set("MASTER_ADDR", "127.0.0.1")
    assert store.get("MASTER_ADDR") == b"127.0.0.1"
    assert store.add("members", 1) == 1
    store.multi_set(["r0", "r1"], ["a", "b"])
    assert store.multi_get(["r0", "r1"]) == [b"a", b"b"]
    store.wait(["r0"], timedelta(seconds=1))
    assert store.check(["r1"])
    assert store.compare_set("r0", "a", "c") == b"c"
    assert store.num_keys() == 4
    assert store.delete_key("r0") and not store.check(["r0"])


def test_store_keys_expire_after_their_writer_is_gone(etcd_server: EtcdServer) -> None:
    writer_session = EtcdSession(etcd_server.endpoint)
    writer = EtcdStore(writer_session, "run-expiry", lease_ttl=2)
    writer.set("k", "v")
    writer.close()  # stops the lease keep-alive, as a dead agent would
    writer_session.close()
    with EtcdSession(etcd_server.endpoint) as reader_session:
        reader = EtcdStore(reader_session, "run-expiry")
        assert reader.check(["k"])
        time.sleep(3.2)  # TTL + etcd's 0.5 s expiry check + margin
        assert not reader.check(["k"])


def test_session_rides_over_an_etcd_restart(etcd_server: EtcdServer) -> None:
    with EtcdSession(etcd_server.endpoint) as session:
        store = EtcdStore(session, "run-restart", timeout=timedelta(seconds=20))
        store.set("before", "1")
        waiter_result: list[bytes] = []
        waiter = threading.Thread(target=lambda: waiter_result.append(store.get("after")))
        waiter.start()
        etcd_server.restart(down_seconds=0.5)
        began = time.monotonic()
        assert store.get("before") == b"1"  # data dir kept
        reconnect = time.monotonic() - began
        EtcdStore(session, "run-restart").set("after", "2")
        waiter.join(10)
        assert waiter_result == [b"2"]
        assert reconnect < 3.0


def test_unreachable_etcd_fails_after_the_retry_window(etcd_server: EtcdServer) -> None:
    with EtcdSession(etcd_server.endpoint, retry_seconds=1.0) as session:
        backend = EtcdV3RendezvousBackend(session, "run-down")
        etcd_server.stop()
        began = time.monotonic()
        with pytest.raises(RendezvousConnectionError) as raised:
            backend.get_state()
        assert isinstance(raised.value.__cause__, EtcdUnavailableError)
        assert time.monotonic() - began < 5.0
