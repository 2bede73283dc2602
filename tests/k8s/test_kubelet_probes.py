"""The process kubelet runs container probes as a kubelet does, on the real control plane: readiness sets the pod's
Ready condition, a failed liveness probe restarts the container, a startup probe holds the others back and kills a
container that never starts; each failure is an `Unhealthy` event, each kill a `Killing` one."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from flywheel.local.procs import descendants
from tests.cluster.cluster import TestCluster
from tests.etcd_process import free_port
from tests.k8s.kubelet_pods import core_api, events
from tests.k8s.probe_server import QUICK, is_ready, server_pod
from tests.waiting import eventually

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def core(cluster: TestCluster) -> Iterator[client.CoreV1Api]:
    yield from core_api(cluster)


def _restarted_and_ready(core: client.CoreV1Api, name: str) -> bool:
    status = core.read_namespaced_pod(name, "default").status.container_statuses[0]
    return status.restart_count == 1 and bool(status.ready)


def test_readiness_follows_the_probe_and_each_failure_is_an_event(core: client.CoreV1Api, tmp_path: Path) -> None:
    body, _ = server_pod("ready-probe", tmp_path,
                         readinessProbe={"httpGet": {"path": "/ready", "port": "http"}, **QUICK})
    core.create_namespaced_pod("default", body)
    eventually(lambda: core.read_namespaced_pod("ready-probe", "default").status.phase == "Running", 30, "Running")
    said = "Readiness probe failed: HTTP probe failed with statuscode: 503"
    eventually(lambda: said in events(core, "ready-probe", "Unhealthy"), 15, "a failed readiness probe")
    assert not is_ready(core, "ready-probe")  # running, but not ready until the probe passes
    before = events(core, "ready-probe", "Unhealthy")[0]  # the first probes may run before the server listens
    assert before == said or before.endswith("connect: connection refused"), before
    (tmp_path / "ready").touch()
    eventually(lambda: is_ready(core, "ready-probe"), 15, "Ready after the probe passed")
    (tmp_path / "ready").unlink()
    eventually(lambda: not is_ready(core, "ready-probe"), 15, "not Ready after failureThreshold failures")
    assert core.read_namespaced_pod("ready-probe", "default").status.container_statuses[0].restart_count == 0


def test_a_failed_liveness_probe_restarts_the_container(core: client.CoreV1Api, tmp_path: Path) -> None:
    probe = {"exec": {"command": ["test", "-f", str(tmp_path / "alive")]}, "terminationGracePeriodSeconds": 1,
             **QUICK}
    body, _ = server_pod("live-probe", tmp_path, livenessProbe=probe)
    core.create_namespaced_pod("default", body)
    eventually(lambda: is_ready(core, "live-probe"), 30, "Ready: no readiness probe, so once started")
    eventually(lambda: (tmp_path / "alive").exists(), 15, "the container's file")
    (tmp_path / "alive").unlink()  # the probe's command now fails; the restarted container makes the file again
    eventually(lambda: events(core, "live-probe", "Killing"), 20, "a kill for the liveness probe")
    assert events(core, "live-probe", "Killing") == ["Container main failed liveness probe, will be restarted"]
    eventually(lambda: _restarted_and_ready(core, "live-probe"), 20, "the container restarted and running again")
    assert any(m.startswith("Liveness probe failed: ") for m in events(core, "live-probe", "Unhealthy"))


def test_a_startup_probe_holds_the_others_and_kills_a_container_that_never_starts(
        core: client.CoreV1Api, tmp_path: Path) -> None:
    (tmp_path / "ready").touch()  # readiness would pass at once: only the startup probe holds it back
    closed = free_port()  # nothing listens there
    body, _ = server_pod("start-probe", tmp_path, restart="Never",
                         startupProbe={"tcpSocket": {"port": closed}, "periodSeconds": 1, "failureThreshold": 3},
                         readinessProbe={"httpGet": {"path": "/ready", "port": "http"}, **QUICK})
    core.create_namespaced_pod("default", body)
    eventually(lambda: core.read_namespaced_pod("start-probe", "default").status.phase == "Succeeded", 30,
               "ended: killed for its startup probe (its SIGTERM handler exits 0), restartPolicy Never")
    assert (tmp_path / "alive").read_text().split() == ["SIGTERM"]  # never asked for /ready
    assert events(core, "start-probe", "Killing") == ["Container main failed startup probe, will be restarted"]
    failures = events(core, "start-probe", "Unhealthy")
    assert failures and all(m.startswith(f"Startup probe failed: dial tcp 127.0.0.1:{closed}") for m in failures)
    status = core.read_namespaced_pod("start-probe", "default").status.container_statuses[0]
    assert not status.ready and status.state.terminated is not None


def test_a_passing_startup_probe_starts_the_container_then_readiness_decides(core: client.CoreV1Api,
                                                                           tmp_path: Path) -> None:
    body, _ = server_pod("started-probe", tmp_path, startupProbe={"tcpSocket": {"port": "http"}, **QUICK})
    core.create_namespaced_pod("default", body)
    eventually(lambda: is_ready(core, "started-probe"), 30, "Ready once the startup probe passed (no readiness probe)")
    status = core.read_namespaced_pod("started-probe", "default").status.container_statuses[0]
    assert status.started and status.restart_count == 0


def test_a_hung_container_fails_its_http_liveness_probe_and_is_restarted(cluster: TestCluster,
                                                                        core: client.CoreV1Api,
                                                                        tmp_path: Path) -> None:
    assert cluster.kubelet is not None
    probe = {"httpGet": {"path": "/", "port": "http"}, **QUICK}
    (tmp_path / "ready").touch()
    # The API server allows terminationGracePeriodSeconds on liveness and startup probes only.
    body, _ = server_pod("hung-probe", tmp_path, livenessProbe={**probe, "terminationGracePeriodSeconds": 1},
                         readinessProbe=probe)
    core.create_namespaced_pod("default", body)
    eventually(lambda: is_ready(core, "hung-probe"), 30, "Ready")
    pid = cluster.kubelet.pid_of("default", "hung-probe")
    assert pid is not None
    for hung in (pid, *descendants(pid)):
        os.kill(hung, signal.SIGSTOP)
    eventually(lambda: _restarted_and_ready(core, "hung-probe"), 30, "the hung container restarted and ready again")
    assert cluster.kubelet.pid_of("default", "hung-probe") != pid
