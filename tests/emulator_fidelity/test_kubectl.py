"""The real kubectl binary against the emulator: CRDs, apply, printer columns, scale, patch, finalizers."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.emulator_fidelity.conftest import KUBECTL, MINIJOB_CRD, minijob
from tests.k8s_emulator.fixtures import RunningCluster

pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="run scripts/install-tools.sh for .tools/bin/kubectl")

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def kubectl(shared_cluster: RunningCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    cache = tmp_path_factory.mktemp("kube-cache")  # never reuse discovery cached for another port

    def run(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(KUBECTL), "--kubeconfig", str(shared_cluster.kubeconfig), "--cache-dir",
                                 str(cache), *args], input=stdin, capture_output=True, text=True, timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    crd_file = cache / "crd.yaml"
    crd_file.write_text(yaml.safe_dump(MINIJOB_CRD))
    assert "created" in run("apply", "-f", str(crd_file)).stdout
    yield run


def _get(kubectl: Kubectl, name: str) -> dict:
    return json.loads(kubectl("get", "minijob", name, "-o", "json").stdout)


def test_apply_create_then_configure_with_defaults(kubectl: Kubectl) -> None:
    manifest = yaml.safe_dump(minijob("apply-me", replicas=2))
    assert "minijob.test.flywheel.dev/apply-me created" in kubectl("apply", "-f", "-", stdin=manifest).stdout
    obj = _get(kubectl, "apply-me")
    assert obj["spec"]["image"] == "python:3.11"  # schema default
    assert obj["metadata"]["generation"] == 1 and obj["metadata"]["namespace"] == "default"
    again = kubectl("apply", "-f", "-", stdin=yaml.safe_dump(minijob("apply-me", replicas=3)))
    assert "configured" in again.stdout and "warning" not in again.stderr.lower()
    obj = _get(kubectl, "apply-me")
    assert obj["spec"]["replicas"] == 3 and obj["metadata"]["generation"] == 2


def test_get_shows_printer_columns_and_short_name(kubectl: Kubectl, shared_cluster: RunningCluster) -> None:
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(minijob("columns", replicas=3)))
    kubectl("patch", "mj", "columns", "--subresource", "status", "--type", "merge", "-p",
            '{"status": {"phase": "Running", "ready": 2}}')
    lines = kubectl("get", "mj", "columns").stdout.splitlines()
    assert lines[0].split() == ["NAME", "PHASE", "REPLICAS", "AGE"]
    name, phase, replicas, age = lines[1].split()
    assert (name, phase, replicas) == ("columns", "Running", "3") and age.endswith("s")


def test_invalid_objects_are_rejected_with_422_or_strict_400(kubectl: Kubectl) -> None:
    too_many = kubectl("apply", "-f", "-", stdin=yaml.safe_dump(minijob("bad", replicas=9, max_replicas=4)),
                       check=False)
    assert too_many.returncode != 0 and "replicas must not exceed maxReplicas" in too_many.stderr
    bad_enum = kubectl("apply", "-f", "-", stdin=yaml.safe_dump(minijob("bad", mode="slow")), check=False)
    assert bad_enum.returncode != 0 and 'Unsupported value: "slow"' in bad_enum.stderr
    unknown = kubectl("apply", "-f", "-", stdin=yaml.safe_dump(minijob("bad", bogus=1)), check=False)
    assert unknown.returncode != 0 and 'unknown field "spec.bogus"' in unknown.stderr
    assert kubectl("get", "mj", "bad", check=False).returncode != 0


def test_scale_sets_the_spec_replicas_path(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(minijob("scaled", replicas=1, max_replicas=5)))
    assert "scaled" in kubectl("scale", "mj", "scaled", "--replicas", "4").stdout
    assert _get(kubectl, "scaled")["spec"]["replicas"] == 4
    over = kubectl("scale", "mj", "scaled", "--replicas", "6", check=False)
    assert over.returncode != 0 and "replicas must not exceed maxReplicas" in over.stderr
    scale = json.loads(kubectl("get", "--raw", "/apis/test.flywheel.dev/v1/namespaces/default/minijobs/scaled/scale")
                       .stdout)
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 4


def test_patch_merge_and_json(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(minijob("patched", labels={"a": "1", "b": "2"})))
    kubectl("patch", "mj", "patched", "--type", "merge", "-p", '{"spec": {"labels": {"a": null, "c": "3"}}}')
    assert _get(kubectl, "patched")["spec"]["labels"] == {"b": "2", "c": "3"}
    kubectl("patch", "mj", "patched", "--type", "json", "-p",
            '[{"op": "replace", "path": "/spec/replicas", "value": 2}, {"op": "remove", "path": "/spec/labels/b"}]')
    obj = _get(kubectl, "patched")
    assert obj["spec"]["replicas"] == 2 and obj["spec"]["labels"] == {"c": "3"}
    strategic = kubectl("patch", "mj", "patched", "-p", '{"spec": {"replicas": 3}}', check=False)
    assert strategic.returncode != 0  # strategic merge is refused for custom resources, as by a real server


def test_delete_with_finalizer_waits_for_its_removal(kubectl: Kubectl) -> None:
    job = minijob("finalized")
    job["metadata"]["finalizers"] = ["test.flywheel.dev/cleanup"]
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(job))
    kubectl("delete", "mj", "finalized", "--wait=false")
    obj = _get(kubectl, "finalized")
    assert obj["metadata"]["deletionTimestamp"]
    kubectl("patch", "mj", "finalized", "--type", "json", "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]')
    assert kubectl("wait", "--for=delete", "mj/finalized", "--timeout=10s", check=False).returncode == 0
    assert "NotFound" in kubectl("get", "mj", "finalized", check=False).stderr


def test_describe_shows_events_and_pods_run(kubectl: Kubectl, shared_cluster: RunningCluster) -> None:
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(minijob("described")))
    uid = _get(kubectl, "described")["metadata"]["uid"]
    event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "described.1"},
             "involvedObject": {"apiVersion": "test.flywheel.dev/v1", "kind": "MiniJob", "name": "described",
                                "namespace": "default", "uid": uid},
             "reason": "Started", "message": "workers are up", "type": "Normal", "count": 1,
             "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z"}
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(event))
    described = kubectl("describe", "mj", "described").stdout
    assert "Started" in described and "workers are up" in described
    kubectl("run", "hello", "--image=python", "--restart=Never", "--command", "--", "python", "-c", "print('hi')")
    deadline = time.monotonic() + 20
    while "Completed" not in kubectl("get", "pod", "hello").stdout and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "Completed" in kubectl("get", "pod", "hello").stdout
    assert kubectl("logs", "hello").stdout == "hi\n"


def test_protobuf_bodies_from_typed_clients_and_helm(kubectl: Kubectl, shared_cluster: RunningCluster,
                                                     tmp_path: Path) -> None:
    assert "namespace/proto created" in kubectl("create", "namespace", "proto").stdout
    secret = json.loads(kubectl("create", "secret", "generic", "creds", "-n", "proto", "--from-literal=k=v",
                                "-o", "json").stdout)
    assert secret["data"] == {"k": "dg=="} and secret["type"] == "Opaque"
    # stringData is write-only: stored base64 in data (over a data key of the same name), on create and on update.
    manifest = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "strings", "namespace": "proto"},
                "data": {"a": "eA==", "b": "eQ=="}, "stringData": {"b": "token"}}
    kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    stored = json.loads(kubectl("get", "secret", "strings", "-n", "proto", "-o", "json").stdout)
    assert stored["data"] == {"a": "eA==", "b": "dG9rZW4="} and "stringData" not in stored
    kubectl("apply", "-f", "-", stdin=json.dumps({**manifest, "stringData": {"b": "other"}}))
    stored = json.loads(kubectl("get", "secret", "strings", "-n", "proto", "-o", "json").stdout)
    assert stored["data"]["b"] == "b3RoZXI=" and "stringData" not in stored
    helm = KUBECTL.with_name("helm")
    if not helm.exists():
        return
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: tiny\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: from-helm}\n")
    env = {"KUBECONFIG": str(shared_cluster.kubeconfig), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for args in (["install", "tiny", str(chart), "-n", "proto"], ["uninstall", "tiny", "-n", "proto"]):
        result = subprocess.run([str(helm), *args], env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        if args[0] == "install":
            assert kubectl("get", "configmap", "from-helm", "-n", "proto").returncode == 0
    assert kubectl("get", "configmap", "from-helm", "-n", "proto", check=False).returncode != 0
