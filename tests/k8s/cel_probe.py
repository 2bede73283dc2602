"""Asking a real API server which values CEL rules refuse: a module-scoped control plane without nodes, dry-run
creates whose 422 causes name the refused fields, and throwaway CRDs ("probes") whose spec has one property per
rule (or group of rules) under test, so one request judges many (rule, value) pairs at once."""

from __future__ import annotations

import copy
import functools
import http.client
import json
import ssl
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.cluster import TestCluster
from tests.cluster.fixtures import start_cluster

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "trainingjobs.flywheel.dev.yaml"
PROBE_GROUP = "probe.flywheel.dev"
# The causes of an error that keeps the API server from running any CEL rule of the object (hasBlockingErr in
# apiextensions-apiserver): a type, enum, required or bound violation (a wrong type may come as FieldValueInvalid).
BLOCKING = {"FieldValueTypeInvalid", "FieldValueNotSupported", "FieldValueRequired", "FieldValueTooLong",
            "FieldValueTooMany"}
NOT_CHECKED = "some validation rules were not checked"
OUT_OF_BUDGET = "cost budget"

Cause = tuple[str, str, str]  # (field, message, reason)


class Api:
    """Admin requests over one kept-alive connection (a TLS handshake per request would dominate)."""

    def __init__(self, cluster: TestCluster) -> None:
        url = urllib.parse.urlparse(cluster.control_plane.api_url)
        context = ssl.create_default_context(cafile=str(cluster.ca_file))
        self._conn = http.client.HTTPSConnection(url.hostname or "127.0.0.1", url.port, context=context, timeout=60)
        self._headers = {"Authorization": f"Bearer {cluster.admin_token}", "Content-Type": "application/json"}
        self.cluster = cluster

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        self._conn.request(method, path, json.dumps(body) if body is not None else None, self._headers)
        reply = self._conn.getresponse()
        return reply.status, json.loads(reply.read() or b"{}")

    def create_crds(self, *crds: dict[str, Any]) -> None:
        """Create them all, then wait for each: the API server establishes them side by side."""
        for crd in crds:
            status, body = self.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            assert status == 201, body.get("message", body)
        for crd in crds:
            self.cluster.wait_established(crd["metadata"]["name"], timeout=120)
        time.sleep(0.5)  # Established a moment before the resource's handler serves the new schema everywhere

    def dry_run(self, path: str, obj: dict[str, Any]) -> list[Cause]:
        """The causes of the API server's refusal to create `obj` (none when it takes it), creating nothing."""
        status, body = self.request("POST", f"{path}?dryRun=All", obj)
        if status in (200, 201):
            return []
        assert status == 422, (status, body.get("message", body))
        return [(c.get("field", ""), c.get("message", ""), c.get("reason", ""))
                for c in body["details"].get("causes", [])]


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """A control plane of its own (no nodes: only the API server's validation is asked)."""
    cluster = start_cluster(tmp_path_factory.mktemp("cluster"), nodes=0)
    try:
        yield Api(cluster)
    finally:
        cluster.stop()


@functools.cache
def _committed_crd() -> dict[str, Any]:
    crd: dict[str, Any] = yaml.load(CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return crd


def trainingjob_crd() -> dict[str, Any]:
    """The committed CRD (crds/, what `flywheel crd` writes), a copy of one reading."""
    return copy.deepcopy(_committed_crd())


def spec_schema() -> dict[str, Any]:
    schema: dict[str, Any] = _committed_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"]
    return copy.deepcopy(schema)


TRAININGJOBS = "/apis/flywheel.dev/v1alpha1/namespaces/default/trainingjobs"


def without_rules(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of `schema` without any CEL rule: a probe property carries only the rules under test."""
    out = copy.deepcopy(schema)
    stack = [out]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            node.pop("x-kubernetes-validations", None)
            stack += list(node.values())
        elif isinstance(node, list):
            stack += node
    return out


def probe_crd(plural: str, properties: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A cluster-scoped CRD whose spec has `properties`."""
    kind = plural.capitalize()
    schema = {"type": "object", "properties": {"spec": {"type": "object", "properties": properties}}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{PROBE_GROUP}"},
            "spec": {"group": PROBE_GROUP, "scope": "Cluster",
                     "names": {"plural": plural, "singular": plural, "kind": kind, "listKind": f"{kind}List"},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": schema}}]}}


def probe_path(plural: str) -> str:
    return f"/apis/{PROBE_GROUP}/v1/{plural}"


def probe(api: Api, plural: str, spec: dict[str, Any]) -> list[Cause]:
    """The causes of refusing one probe object; its properties' values are judged side by side."""
    causes = api.dry_run(probe_path(plural), {"apiVersion": f"{PROBE_GROUP}/v1", "kind": plural.capitalize(),
                                              "metadata": {"name": "probe"}, "spec": spec})
    assert not any(OUT_OF_BUDGET in message for _, message, _ in causes), "fewer values per request"
    return causes


def under(field: str, prop: str) -> bool:
    """Whether the cause's field is the probe property `prop` or below it."""
    head = f"spec.{prop}"
    return field == head or field.startswith((head + ".", head + "["))


def blocked_properties(causes: list[Cause]) -> set[str]:
    """The probe properties whose value kept every CEL rule of the object from running."""
    if not any(NOT_CHECKED in message for _, message, _ in causes):
        return set()
    found = {field.split(".")[1].split("[")[0] for field, message, reason in causes
             if (reason in BLOCKING or "must be of type" in message) and field.startswith("spec.")}
    assert found, causes  # the blocking error names its property
    return found
