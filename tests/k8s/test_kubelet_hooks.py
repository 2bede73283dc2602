"""The process kubelet's container lifecycle hooks on the real control plane: `preStop` (sleep, exec, httpGet) runs
on deletion before SIGTERM and within the grace period, a failed one is a `FailedPreStopHook` Warning; `postStart`
runs before the container counts as Running, and a failed one kills the container."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.cluster import TestCluster
from tests.k8s.kubelet_pods import core_api, events, gone
from tests.k8s.probe_server import is_ready, server_pod
from tests.waiting import eventually

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def core(cluster: TestCluster) -> Iterator[client.CoreV1Api]:
    yield from core_api(cluster)


def _stopping_pod(name: str, tmp_path: Path, sleep: int, grace: int) -> dict[str, Any]:
    """Notes the time of its SIGTERM in tmp_path/name, and exits."""
    code = (f"import pathlib, signal, sys, time\n"
            f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(tmp_path / name)!r}).write_text("
            f"str(time.time())), sys.exit(0)))\n"
            f"pathlib.Path({str(tmp_path / (name + '.ready'))!r}).touch()\n"
            "while True: time.sleep(0.05)")
    container = {"name": "main", "image": "python:3.11", "command": ["python", "-c", code],
                 "lifecycle": {"preStop": {"sleep": {"seconds": sleep}}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": grace, "containers": [container]}}


def test_a_pre_stop_sleep_runs_before_sigterm_within_the_grace_period(core: client.CoreV1Api,
                                                                     tmp_path: Path) -> None:
    """The container keeps running for the hook's seconds after the deletion, then gets SIGTERM; a hook longer than
    the deletion's grace period is cut to it (SIGTERM then has a one-off 2 s). The API server refuses a sleep longer
    than the pod's own grace period, so the cut comes from a shorter grace given to the delete."""
    cases = (("hooked", 2, 30, None, 1.9, 10.0), ("cut", 60, 90, 3, 2.9, 20.0))
    for name, sleep, grace, delete_grace, at_least, at_most in cases:
        core.create_namespaced_pod("default", _stopping_pod(name, tmp_path, sleep, grace))
        eventually((tmp_path / f"{name}.ready").exists, 60, what=f"{name}'s handler installed")
        deleted = time.time()
        core.delete_namespaced_pod(name, "default", grace_period_seconds=delete_grace)
        eventually((tmp_path / name).exists, 60, what=f"{name}'s SIGTERM")
        termed = float((tmp_path / name).read_text()) - deleted
        assert at_least <= termed <= at_most, (name, termed)
        eventually(gone(core, name), 30, what=f"{name} removed")


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
        body, _ = server_pod(f"hook-{name}", tmp_path / name)
        body["spec"]["containers"][0]["lifecycle"] = {"preStop": hook}
        core.create_namespaced_pod("default", body)
    for name in hooks:
        eventually(lambda: is_ready(core, f"hook-{name}") and (tmp_path / name / "alive").exists(), 30, "started")
        core.delete_namespaced_pod(f"hook-{name}", "default")
    for name in hooks:
        eventually(gone(core, f"hook-{name}"), 30, f"hook-{name} deleted")
    assert (tmp_path / "http" / "alive").read_text().split() == ["/prestop", "SIGTERM"]
    assert (tmp_path / "exec" / "alive").read_text().splitlines() == ["exec hook", "SIGTERM"]
    assert (tmp_path / "failing" / "alive").read_text().split() == ["SIGTERM"]
    [said] = events(core, "hook-failing", "FailedPreStopHook")
    assert said.startswith("Exec lifecycle hook (['false']) for Container \"main\"") and "exited with 1" in said


def test_post_start_runs_before_the_container_is_running_and_a_failed_one_kills_it(
        core: client.CoreV1Api, tmp_path: Path) -> None:
    for name, command, restart in (("ok", ["touch", str(tmp_path / "ok" / "hooked")], "Always"),
                                   ("failing", ["false"], "Never")):
        (tmp_path / name).mkdir()
        body, _ = server_pod(f"post-{name}", tmp_path / name, restart=restart)
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
    [said] = events(core, "post-failing", "FailedPostStartHook")
    assert said.startswith("Exec lifecycle hook (['false']) for Container \"main\"") and "exited with 1" in said
    assert not events(core, "post-failing", "Started")  # never Running
