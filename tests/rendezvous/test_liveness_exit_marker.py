"""An agent's exit marker replaces only its own liveness key (real etcd): a gracefully stopped worker whose
replica a promoted spare already took (drain ahead moves a worker while its old pod is still shutting down) must
not mark the spare's fresh key `exited`, which the operator would read as the spare's agent gone."""

from __future__ import annotations

import json
import time

from flywheel.etcd import keys
from flywheel.etcd.liveness import WorkerRegistration
from flywheel.etcd.session import EtcdSession

from .etcd_server import EtcdServer


def _read(session: EtcdSession, key: bytes) -> dict:  # type: ignore[type-arg]
    found = session.call(lambda c: c.get(key))
    return json.loads(found.value) if found is not None else {}


def _wait_for(session: EtcdSession, key: bytes) -> None:
    deadline = time.monotonic() + 5
    while session.call(lambda c: c.get(key)) is None:
        assert time.monotonic() < deadline, "the registration never wrote its key"
        time.sleep(0.02)


def test_the_exit_marker_leaves_a_newer_registration_of_the_replica_alone(etcd_server: EtcdServer) -> None:
    key = keys.worker_key("job-x", "1")
    with EtcdSession(etcd_server.endpoint) as session:
        old = WorkerRegistration(session, "job-x", "1", ttl=5).start()
        _wait_for(session, key)
        new = WorkerRegistration(session, "job-x", "1", ttl=5).start()  # the promoted spare's agent
        time.sleep(0.3)  # its first put lands (its own lease, after the old one's)
        took = _read(session, key)
        old.close()  # the old agent ends by itself after the spare registered
        assert _read(session, key) == took and "exited" not in took
        new.close()  # its own key: marked
        assert _read(session, key).get("exited") is True


def test_the_exit_marker_still_marks_its_own_key(etcd_server: EtcdServer) -> None:
    key = keys.worker_key("job-y", "0")
    with EtcdSession(etcd_server.endpoint) as session:
        registration = WorkerRegistration(session, "job-y", "0", ttl=5).start()
        _wait_for(session, key)
        registration.close()
        assert _read(session, key).get("exited") is True
