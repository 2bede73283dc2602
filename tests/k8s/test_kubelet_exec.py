"""`kubectl exec` through the real API server to the process kubelet's `/exec` (WebSocket v5.channel.k8s.io): the
command's stdout, stderr and stdin, the container's environment, working directory and user, its exit code as
kubectl's, and clear failures for a missing program or container; through the fault proxy (its WebSocket relay,
tests/cluster/ws_relay.py), as every test's kubectl goes."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.cluster.cluster import TestCluster
from tests.cluster.fixtures import start_cluster
from tests.k8s.kubelet_pods import KUBECTL, REPO, Kubectl, core_api, phase_is
from tests.waiting import eventually as wait_for

pytestmark = pytest.mark.slow
SLEEP = ["python", "-c", "import time; time.sleep(600)"]


@pytest.fixture(scope="module")
def exec_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    running = start_cluster(tmp_path_factory.mktemp("exec"), nodes=1)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def kubectl(exec_cluster: TestCluster) -> Iterator[Kubectl]:
    core = next(core_api(exec_cluster))
    sleeper = {"name": "main", "image": "python:3.11", "command": SLEEP, "env": [{"name": "GREETING", "value": "hi"}]}
    as_user = {**sleeper, "securityContext": {"runAsUser": 1234, "runAsGroup": 2345}}
    for name, container in (("sleeper", sleeper), ("as-user", as_user)):
        core.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                                               "spec": {"containers": [container]}})
    for name in ("sleeper", "as-user"):
        wait_for(phase_is(core, name, "Running"), 30, what=f"{name} Running")

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(KUBECTL), "--kubeconfig", str(exec_cluster.kubeconfig), *args], input=stdin,
                              capture_output=True, text=True, timeout=60, check=False)
    yield run
    core.api_client.close()


def test_stdout_and_stderr_come_apart(kubectl: Kubectl) -> None:
    done = kubectl("exec", "sleeper", "--", "sh", "-c", "echo out; echo err >&2")
    assert (done.returncode, done.stdout, done.stderr) == (0, "out\n", "err\n")


def test_the_command_has_the_containers_env_and_working_directory(kubectl: Kubectl) -> None:
    done = kubectl("exec", "sleeper", "--", "sh", "-c", 'echo "$GREETING $KUBERNETES_SERVICE_HOST"; pwd; id -u')
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["hi 127.0.0.1", str(REPO), "0"]


def test_the_command_runs_as_the_containers_user(kubectl: Kubectl) -> None:
    done = kubectl("exec", "as-user", "--", "sh", "-c", "id -u; id -g")
    assert (done.returncode, done.stdout.split()) == (0, ["1234", "2345"]), done.stderr


def test_the_exit_code_is_kubectls(kubectl: Kubectl) -> None:
    done = kubectl("exec", "sleeper", "--", "sh", "-c", "echo partial; exit 3")
    assert (done.returncode, done.stdout) == (3, "partial\n")
    assert "command terminated with exit code 3" in done.stderr


def test_stdin_is_piped_with_i(kubectl: Kubectl) -> None:
    done = kubectl("exec", "-i", "sleeper", "--", "sh", "-c", "tr a-z A-Z; echo done", stdin="hello\nworld\n")
    assert (done.returncode, done.stdout) == (0, "HELLO\nWORLD\ndone\n"), done.stderr


def test_a_missing_program_fails_clearly(kubectl: Kubectl) -> None:
    done = kubectl("exec", "sleeper", "--", "no-such-program", "x")
    assert done.returncode != 0
    assert 'exec: "no-such-program": executable file not found in $PATH' in done.stderr


def test_an_unknown_container_or_pod_fails(kubectl: Kubectl) -> None:
    assert kubectl("exec", "sleeper", "-c", "nope", "--", "true").returncode != 0
    missing = kubectl("exec", "no-such-pod", "--", "true")
    assert missing.returncode != 0 and "not found" in missing.stderr


def test_a_killed_command_reports_its_signal_as_a_shell_does(kubectl: Kubectl) -> None:
    done = kubectl("exec", "sleeper", "--", "sh", "-c", "kill -TERM $$")
    assert done.returncode == 128 + 15, done.stderr

