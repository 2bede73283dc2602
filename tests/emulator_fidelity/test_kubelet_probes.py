"""The process kubelet runs container probes as a kubelet does (tests/k8s_emulator/probes.py): readiness sets the
pod's Ready condition, a failed liveness probe restarts the container, a startup probe holds the others back and
kills a container that never starts; each failure is an `Unhealthy` event, each kill a `Killing` one."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from flywheel.local.procs import descendants
from tests.etcd_process import free_port
from tests.k8s_emulator.fixtures import RunningCluster
from tests.waiting import eventually

# Serves /ready with 200 while the file READY names exists (else 503), creates ALIVE at start, notes every path it
# is asked for in ALIVE, and notes a SIGTERM there too.
SERVER = """
import http.server, os, pathlib, signal, sys
pathlib.Path(os.environ["ALIVE"]).touch()
def note(line):
    with open(os.environ["ALIVE"], "a") as f:
        f.write(line + "\\n")
signal.signal(signal.SIGTERM, lambda *a: (note("SIGTERM"), sys.exit(0)))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        note(self.path)
        self.send_response(200 if os.path.exists(os.environ["READY"]) else 503)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""
QUICK = {"periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 2}


@pytest.fixture
def core(cluster: RunningCluster) -> Iterator[client.CoreV1Api]:
    api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield client.CoreV1Api(api_client)
    api_client.close()


def _pod(name: str, tmp: Path, restart: str = "Always", **probes: dict[str, Any]) -> tuple[dict[str, Any], int]:
    port = free_port()
    env = [{"name": "PORT", "value": str(port)}, {"name": "READY", "value": str(tmp / "ready")},
           {"name": "ALIVE", "value": str(tmp / "alive")}]
    container = {"name": "main", "image": "python:3.11", "command": ["python", "-c", SERVER], "env": env,
                 "ports": [{"name": "http", "containerPort": port}], **probes}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": 1, "containers": [container]}}, port


def _ready(core: client.CoreV1Api, name: str) -> bool:
    pod = core.read_namespaced_pod(name, "default")
    ready = [c.status for c in pod.status.conditions or [] if c.type == "Ready"]
    statuses = pod.status.container_statuses or []
    return ready == ["True"] and bool(statuses) and bool(statuses[0].ready)


def _events(core: client.CoreV1Api, name: str, reason: str) -> list[str]:
    found = core.list_namespaced_event("default").items
    return [e.message for e in found if e.involved_object.name == name and e.reason == reason]


def test_readiness_follows_the_probe_and_each_failure_is_an_event(core: client.CoreV1Api, tmp_path: Path) -> None:
    body, _ = _pod("ready-probe", tmp_path, readinessProbe={"httpGet": {"path": "/ready", "port": "http"}, **QUICK})
    core.create_namespaced_pod("default", body)
    eventually(lambda: core.read_namespaced_pod("ready-probe", "default").status.phase == "Running", 30, "Running")
    said = "Readiness probe failed: HTTP probe failed with statuscode: 503"
    eventually(lambda: said in _events(core, "ready-probe", "Unhealthy"), 15, "a failed readiness probe")
    assert not _ready(core, "ready-probe")  # running, but not ready until the probe passes
    before = _events(core, "ready-probe", "Unhealthy")[0]  # the first probes ran before the server listened
    assert before == said or before.endswith("connect: connection refused"), before
    (tmp_path / "ready").touch()
    eventually(lambda: _ready(core, "ready-probe"), 15, "Ready after the probe passed")
    (tmp_path / "ready").unlink()
    eventually(lambda: not _ready(core, "ready-probe"), 15, "not Ready after failureThreshold failures")
    assert core.read_namespaced_pod("ready-probe", "default").status.container_statuses[0].restart_count == 0


def test_a_failed_liveness_probe_restarts_the_container(core: client.CoreV1Api, tmp_path: Path) -> None:
    probe = {"exec": {"command": ["test", "-f", str(tmp_path / "alive")]}, "terminationGracePeriodSeconds": 1,
             **QUICK}
    body, _ = _pod("live-probe", tmp_path, livenessProbe=probe)
    core.create_namespaced_pod("default", body)
    eventually(lambda: _ready(core, "live-probe"), 30, "Ready: no readiness probe, so once started")
    eventually(lambda: (tmp_path / "alive").exists(), 15, "the container's file")
    (tmp_path / "alive").unlink()  # the probe's command now fails; the restarted container makes the file again
    eventually(lambda: _events(core, "live-probe", "Killing"), 20, "a kill for the liveness probe")
    assert _events(core, "live-probe", "Killing") == ["Container main failed liveness probe, will be restarted"]

    def restarted() -> bool:
        status = core.read_namespaced_pod("live-probe", "default").status.container_statuses[0]
        return status.restart_count == 1 and bool(status.ready)
    eventually(restarted, 20, "the container restarted and running again")
    assert any(m.startswith("Liveness probe failed: ") for m in _events(core, "live-probe", "Unhealthy"))


def test_a_startup_probe_holds_the_others_and_kills_a_container_that_never_starts(
        core: client.CoreV1Api, tmp_path: Path) -> None:
    (tmp_path / "ready").touch()  # readiness would pass at once: only the startup probe holds it back
    closed = free_port()  # nothing listens there
    body, _ = _pod("start-probe", tmp_path, restart="Never",
                   startupProbe={"tcpSocket": {"port": closed}, "periodSeconds": 1, "failureThreshold": 3},
                   readinessProbe={"httpGet": {"path": "/ready", "port": "http"}, **QUICK})
    core.create_namespaced_pod("default", body)
    eventually(lambda: core.read_namespaced_pod("start-probe", "default").status.phase == "Succeeded", 30,
               "ended: killed for its startup probe (its SIGTERM handler exits 0), restartPolicy Never")
    assert (tmp_path / "alive").read_text().split() == ["SIGTERM"]
    assert _events(core, "start-probe", "Killing") == ["Container main failed startup probe, will be restarted"]
    failures = _events(core, "start-probe", "Unhealthy")
    assert failures and all(m.startswith(f"Startup probe failed: dial tcp 127.0.0.1:{closed}") for m in failures)
    # The readiness probe never ran (it would have passed): the container never started.
    status = core.read_namespaced_pod("start-probe", "default").status.container_statuses[0]
    assert not status.ready and status.state.terminated is not None


def test_a_passing_startup_probe_starts_the_container_then_readiness_decides(core: client.CoreV1Api,
                                                                           tmp_path: Path) -> None:
    body, port = _pod("started-probe", tmp_path, startupProbe={"tcpSocket": {"port": "http"}, **QUICK})
    core.create_namespaced_pod("default", body)
    eventually(lambda: _ready(core, "started-probe"), 30, "Ready once the startup probe passed (no readiness probe)")
    status = core.read_namespaced_pod("started-probe", "default").status.container_statuses[0]
    assert status.started and status.restart_count == 0


def test_a_hung_container_fails_its_http_liveness_probe_and_is_restarted(cluster: RunningCluster,
                                                                        core: client.CoreV1Api,
                                                                        tmp_path: Path) -> None:
    probe = {"httpGet": {"path": "/", "port": "http"}, "terminationGracePeriodSeconds": 1, **QUICK}
    (tmp_path / "ready").touch()
    body, _ = _pod("hung-probe", tmp_path, livenessProbe=probe, readinessProbe={**probe, "periodSeconds": 1})
    core.create_namespaced_pod("default", body)
    eventually(lambda: _ready(core, "hung-probe"), 30, "Ready")
    pid = cluster.kubelet.pid_of("default", "hung-probe")
    assert pid is not None
    for hung in (pid, *descendants(pid)):
        os.kill(hung, signal.SIGSTOP)

    def restarted() -> bool:
        status = core.read_namespaced_pod("hung-probe", "default").status.container_statuses[0]
        return status.restart_count == 1 and bool(status.ready)
    eventually(restarted, 30, "the hung container restarted and ready again")
    assert cluster.kubelet.pid_of("default", "hung-probe") != pid


def _deleted(core: client.CoreV1Api, name: str) -> bool:
    return not [p for p in core.list_namespaced_pod("default").items if p.metadata.name == name]


def test_pre_stop_exec_and_http_hooks_run_before_sigterm_and_a_failed_one_is_an_event(
        core: client.CoreV1Api, tmp_path: Path) -> None:
    """`lifecycle.preStop` `httpGet` and `exec` run on deletion, before SIGTERM (the same handlers as the probes);
    a failing hook is a `FailedPreStopHook` Warning and the container still gets its SIGTERM."""
    hooks = {"http": {"httpGet": {"path": "/prestop", "port": "http"}},
             "exec": {"exec": {"command": ["python", "-c", f"open({str(tmp_path / 'exec' / 'alive')!r}, 'a')"
                                                           ".write('exec hook\\n')"]}},
             "failing": {"exec": {"command": ["false"]}}}
    for name, hook in hooks.items():
        (tmp_path / name).mkdir()
        body, _ = _pod(f"hook-{name}", tmp_path / name)
        body["spec"]["containers"][0]["lifecycle"] = {"preStop": hook}
        core.create_namespaced_pod("default", body)
        eventually(lambda: _ready(core, f"hook-{name}") and (tmp_path / name / "alive").exists(), 30, "started")
        core.delete_namespaced_pod(f"hook-{name}", "default")
        eventually(lambda: _deleted(core, f"hook-{name}"), 30, f"hook-{name} deleted")
    assert (tmp_path / "http" / "alive").read_text().split() == ["/prestop", "SIGTERM"]
    assert (tmp_path / "exec" / "alive").read_text().splitlines() == ["exec hook", "SIGTERM"]
    assert (tmp_path / "failing" / "alive").read_text().split() == ["SIGTERM"]
    [said] = _events(core, "hook-failing", "FailedPreStopHook")
    assert said.startswith("Exec lifecycle hook ([\'false\']) for Container \"main\"") and "exited with 1" in said



def test_post_start_runs_before_the_container_is_running_and_a_failed_one_kills_it(
        core: client.CoreV1Api, tmp_path: Path) -> None:
    for name, command, restart in (("ok", ["touch", str(tmp_path / "ok" / "hooked")], "Always"),
                                   ("failing", ["false"], "Never")):
        (tmp_path / name).mkdir()
        body, _ = _pod(f"post-{name}", tmp_path / name, restart=restart)
        body["spec"]["containers"][0]["lifecycle"] = {"postStart": {"exec": {"command": command}}}
        core.create_namespaced_pod("default", body)

    def running_after_its_hook() -> bool:
        pod = core.read_namespaced_pod("post-ok", "default")
        if pod.status.phase != "Running" or not pod.status.container_statuses[0].state.running:
            return False
        assert (tmp_path / "ok" / "hooked").exists()  # the hook was done before the container was Running
        return True
    eventually(running_after_its_hook, 30, "post-ok Running")
    # Killed, restartPolicy Never: Succeeded or Failed as the SIGTERM found its handler installed or not yet.
    eventually(lambda: core.read_namespaced_pod("post-failing", "default").status.phase in ("Succeeded", "Failed"),
               30, "post-failing killed")
    [said] = _events(core, "post-failing", "FailedPostStartHook")
    assert said.startswith("Exec lifecycle hook (['false']) for Container \"main\"") and "exited with 1" in said
    assert not _events(core, "post-failing", "Started")  # never Running
