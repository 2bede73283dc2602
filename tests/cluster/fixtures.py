"""pytest's way into the test cluster: `start_cluster()` starts one (the control plane and the process kubelet) and
returns it started; `cluster` is a ready-made fixture (two nodes, a quick node-lifecycle grace)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.cluster import ClusterOptions, TestCluster


def start_cluster(work_dir: Path | None = None, nodes: int = 2, etcd: bool = False,
                  node_monitor_grace_seconds: float = 40.0, heartbeat_seconds: float = 2.0,
                  **options: Any) -> TestCluster:
    """A started cluster; `.stop()` it (or use it as a context manager). `etcd`: a second etcd for rendezvous."""
    cluster = TestCluster(work_dir, ClusterOptions(nodes=nodes, rendezvous_etcd=etcd,
                                                   node_monitor_grace_seconds=node_monitor_grace_seconds,
                                                   heartbeat_seconds=heartbeat_seconds, **options))
    cluster.start()
    return cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    running = start_cluster(tmp_path_factory.mktemp("cluster"), nodes=2, node_monitor_grace_seconds=4.0,
                            heartbeat_seconds=0.5)
    try:
        yield running
    finally:
        running.stop()
