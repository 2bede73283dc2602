"""On the real Kubernetes API server (tests/cluster): the generated CRD is accepted as it is (a structural schema,
its CEL rules within the cost budget); every example TrainingJob is accepted (the one-machine examples with
ephemeral checkpoints, which the cluster's storage rule asks of them), and the pods `flywheel render` makes for it
pass the Pod API; and a table of values the Pod API would refuse in every worker pod is refused already at
`kubectl apply`, naming the field, as `flywheel plan` refuses it (flywheel/spec/pod_rules/rules.py, one definition for
both). Each table entry's pod is refused by the Pod API too: the rules are the server's, not stricter inventions (the
few that are stricter on purpose have no pod). What the CRD cannot afford to check (amounts under the list of
containers) is refused by `flywheel plan` and the operator, and by the Pod API: GAPS."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from flywheel.spec import SpecError, parse_job
from flywheel.spec.parse import cluster_problems
from tests.cluster.cluster import TestCluster
from tests.cluster.fixtures import cluster  # noqa: F401
from tests.pod_api_cases import GAPS, NO_POD, REFUSED, job, operator_objects
from tests.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
KUBECTL = REPO / ".tools" / "bin" / "kubectl"
CRD = REPO / "crds" / "trainingjobs.flywheel.dev.yaml"
EXAMPLES = sorted(p for p in (REPO / "examples").glob("*.yaml")
                  if any((d or {}).get("kind") == "TrainingJob" for d in yaml.safe_load_all(p.read_text())))

pytestmark = pytest.mark.slow


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                          timeout=60, input=stdin)


@pytest.fixture(scope="module")
def kubeconfig(cluster: TestCluster) -> Path:  # noqa: F811
    """The cluster's admin kubeconfig, with the CRD applied and established."""
    applied = kubectl(cluster.kubeconfig, "apply", "--server-side", "-f", str(CRD))
    assert applied.returncode == 0, applied.stderr
    # Polled, not `kubectl wait`: that fails at once while the new CRD has no conditions yet (a loaded machine).
    cluster.wait_established("trainingjobs.flywheel.dev")
    return cluster.kubeconfig


def python_refusal(doc: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as err:
        parse_job(doc)
    return str(err.value)


def render(doc: dict[str, Any], tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = subprocess.run([sys.executable, "-m", "flywheel.cli", "render", str(path), "-o", "json"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


def dry_run_create(kubeconfig: Path, objects: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    return kubectl(kubeconfig, "create", "--dry-run=server", "-f", "-", stdin=listed)


def test_the_table_is_big_and_varied() -> None:
    assert len(REFUSED) >= 80 and len({case for case, _, _ in REFUSED}) == len(REFUSED)


def test_the_generated_crd_is_accepted_as_it_is(kubeconfig: Path) -> None:
    crd = json.loads(kubectl(kubeconfig, "get", "crd", "trainingjobs.flywheel.dev", "-o", "json").stdout)
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions.get("Established") == "True" and conditions.get("NamesAccepted") == "True", conditions
    assert conditions.get("NonStructuralSchema", "False") == "False", conditions
    stored = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert stored == yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def example_job(example: Path) -> dict[str, Any]:
    """The example's TrainingJob as a cluster takes it: the examples for one machine checkpoint to a local
    directory, which the cluster's storage rule (a cluster policy, not the Pod API's) refuses for several workers
    unless the checkpoints may be lost with their pods (checkpoint.ephemeral)."""
    doc: dict[str, Any] = next(d for d in yaml.safe_load_all(example.read_text()) if (d or {}).get("kind") ==
                               "TrainingJob")
    if cluster_problems(parse_job(doc).spec):
        doc["spec"].setdefault("checkpoint", {})["ephemeral"] = True
    assert not cluster_problems(parse_job(doc).spec)
    return doc


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_is_accepted(kubeconfig: Path, example: Path) -> None:
    applied = kubectl(kubeconfig, "apply", "--dry-run=server", "-f", "-", stdin=json.dumps(example_job(example)))
    assert applied.returncode == 0, applied.stderr


def _namespace_ready(kubeconfig: Path, namespace: str) -> None:
    if kubectl(kubeconfig, "get", "namespace", namespace).returncode != 0:
        kubectl(kubeconfig, "create", "namespace", namespace)
    # The ServiceAccount admission plugin refuses pods until the namespace's default account exists.
    eventually(lambda: kubectl(kubeconfig, "get", "serviceaccount", "default", "-n", namespace).returncode == 0,
               timeout=30)


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_the_pods_rendered_for_every_example_pass_the_pod_api(kubeconfig: Path, example: Path,
                                                              tmp_path: Path) -> None:
    objects = render(example_job(example), tmp_path)
    assert any(o["kind"] == "Pod" for o in objects)
    for namespace in {o["metadata"]["namespace"] for o in objects}:
        _namespace_ready(kubeconfig, namespace)
    created = dry_run_create(kubeconfig, objects)
    assert created.returncode == 0, created.stderr


@pytest.mark.parametrize("case, change, field", REFUSED, ids=[case for case, _, _ in REFUSED])
def test_a_value_the_pod_api_refuses_is_refused_at_apply_naming_the_field(kubeconfig: Path, case: str,
                                                                          change: dict[str, Any], field: str) -> None:
    doc = job(change)
    applied = kubectl(kubeconfig, "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=json.dumps(doc))
    assert applied.returncode != 0, f"{case}: accepted at apply"
    assert field in applied.stderr, applied.stderr
    assert field in python_refusal(doc)  # `flywheel plan` and the operator say the same


def test_the_operators_objects_for_the_valid_job_pass_the_pod_api(kubeconfig: Path) -> None:
    created = dry_run_create(kubeconfig, operator_objects({}))
    assert created.returncode == 0, created.stderr


@pytest.mark.parametrize("case, change, field", REFUSED, ids=[case for case, _, _ in REFUSED])
def test_the_pod_api_refuses_the_pods_of_the_same_value(kubeconfig: Path, case: str, change: dict[str, Any],
                                                        field: str) -> None:
    if case in NO_POD:
        pytest.skip("stricter than the Pod API on purpose, or no pods")
    created = dry_run_create(kubeconfig, operator_objects(change))
    assert created.returncode != 0, f"{case}: the Pod API accepts the operator's objects"


@pytest.mark.parametrize("case, change, field", GAPS, ids=[case for case, _, _ in GAPS])
def test_amounts_under_the_containers_are_refused_by_flywheel_plan_and_the_pod_api(
        kubeconfig: Path, case: str, change: dict[str, Any], field: str) -> None:
    doc = job(change)
    assert field in python_refusal(doc)
    accepted = kubectl(kubeconfig, "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=json.dumps(doc))
    assert accepted.returncode == 0, accepted.stderr  # a known gap of the CRD (see the module's docstring)
    refused = dry_run_create(kubeconfig, operator_objects(change))
    assert refused.returncode != 0, f"{case}: the Pod API accepts it"
