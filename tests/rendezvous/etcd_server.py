"""The pytest fixture for a real etcd (tests/etcd_process.py's `EtcdServer`). Reuse from another test folder's
conftest.py or module:

    from tests.rendezvous.etcd_server import EtcdServer, etcd_server  # noqa: F401  (the pytest fixture)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.etcd_process import EtcdServer

__all__ = ["EtcdServer", "etcd_server"]


@pytest.fixture
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """A fresh etcd per test, stopped (and its data dir left in pytest's tmp) afterwards."""
    server = EtcdServer(tmp_path_factory.mktemp("etcd") / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()
