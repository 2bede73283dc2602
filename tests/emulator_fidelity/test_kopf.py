"""A real kopf operator against the emulator: create/update/delete handlers, status patches, events,
kopf's finalizer, and recovery from dropped watch streams."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.emulator_fidelity.conftest import GROUP, MINIJOB_CRD, PLURAL, VERSION, minijob
from tests.k8s_emulator.fixtures import RunningCluster

pytest.importorskip("kopf")
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

OPERATOR = Path(__file__).with_name("kopf_operator.py")


def _eventually(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def test_kopf_operator_round_trip(cluster: RunningCluster, tmp_path: Path) -> None:
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    client.ApiextensionsV1Api(api).create_custom_resource_definition(MINIJOB_CRD)
    custom = client.CustomObjectsApi(api)
    log_path = tmp_path / "operator.log"
    with open(log_path, "w") as log:
        operator = subprocess.Popen([sys.executable, "-m", "kopf", "run", "--standalone", "-A", str(OPERATOR)],
                                    env={**os.environ, "TEST_CLUSTER_API": cluster.api_url}, stdout=log,
                                    stderr=subprocess.STDOUT)
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, minijob("k1", replicas=1))

        def status() -> dict:
            return custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "k1").get("status", {})

        _eventually(lambda: status().get("phase") == "Running")
        cluster.api.drop_watches()  # kopf must re-watch and still see the next change
        custom.patch_namespaced_custom_object_scale(GROUP, VERSION, "default", PLURAL, "k1",
                                                    {"spec": {"replicas": 3}})
        _eventually(lambda: status().get("seenReplicas") == 3)
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "k1")
        assert obj["metadata"]["finalizers"] == ["kopf.zalando.org/KopfFinalizerMarker"]
        events = client.CoreV1Api(api).list_namespaced_event(
            "default", field_selector=f"involvedObject.name=k1,involvedObject.uid={obj['metadata']['uid']}")
        assert [e.reason for e in events.items] == ["Seen"]
        custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "k1")

        def gone() -> bool:
            try:
                custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "k1")
            except ApiException as err:
                return err.status == 404
            return False

        _eventually(gone)
        assert "cleanup of k1" in log_path.read_text()
    finally:
        operator.terminate()
        operator.wait(15)
        api.close()
