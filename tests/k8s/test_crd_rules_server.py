"""The generated CRD's own CEL rules as the real API server decides them: the layout and checkpoint-storage rules on
`spec` refuse exactly the random specs layout/rules.py finds a covered problem in (at every replica count), and the
pod template's rules refuse the operator-owned pod fields and Kueue metadata in spec/pod_template.py's words, and only
those. Single cases are dry-run TrainingJobs against the committed CRD; the 1500 random specs go 24 to a request
through a probe CRD (tests/k8s/cel_probe.py) whose properties each carry the spec's schema and its rules. The pure
parts are in tests/spec/test_crd_rules.py and tests/spec/test_crd.py."""

from __future__ import annotations

import random
from typing import Any

import pytest

from flywheel.layout.rules import job_problems
from flywheel.spec.crd.generate import COVERED_RULES, MAX_CEL_REPLICA_COUNTS
from flywheel.spec.pod_template import (
    KUEUE_KEYS,
    METADATA_MAPS,
    OWNED_POD_FIELDS,
    kueue_key_problem,
    owned_field_problem,
)
from flywheel.spec.storage import cluster_storage_problems
from tests.k8s.cel_probe import (
    NOT_CHECKED,
    TRAININGJOBS,
    Api,
    Cause,
    api,  # noqa: F401 - the module-scoped control plane
    blocked_properties,
    probe,
    probe_crd,
    spec_schema,
    trainingjob_crd,
    under,
    without_rules,
)
from tests.pod_api_cases import BASE, job, spec
from tests.spec.test_crd_rules import STORAGE_FINE, STORAGE_REFUSED, random_spec, storage_doc

pytestmark = pytest.mark.slow

SPEC_RULES: list[dict[str, Any]] = spec_schema()["x-kubernetes-validations"]
PER_REQUEST = 24  # as many copies of the spec rules as the CRD cost budget takes (about 26)
RANDOM_SPECS = 1500


def spec_rules_property() -> dict[str, Any]:
    """The CRD's spec with only its own rules (the pod template, which they do not read, left out)."""
    node = spec_schema()
    del node["properties"]["template"]
    node = without_rules(node)
    node["x-kubernetes-validations"] = SPEC_RULES
    return node


@pytest.fixture(scope="module")
def jobs(api: Api) -> Api:  # noqa: F811 - the fixture imported above
    node = spec_rules_property()
    api.create_crds(trainingjob_crd(), probe_crd("specrules", {f"j{i}": node for i in range(PER_REQUEST)}))
    return api


def spec_rule_refusals(causes: list[Cause]) -> list[Cause]:
    return [c for c in causes if any(rule["message"] in c[1] for rule in SPEC_RULES)]


def refused_by_spec_rules(client: Api, spec_doc: dict[str, Any]) -> set[str]:
    """The fields the CRD's spec rules refuse a TrainingJob of this spec for (nothing else may refuse it)."""
    causes = client.dry_run(TRAININGJOBS, {**BASE, "spec": {**BASE["spec"], **spec_doc}})
    refused = spec_rule_refusals(causes)
    assert len(refused) == len(causes), causes
    return {field for field, _, _ in refused}


def probe_verdicts(client: Api, docs: list[dict[str, Any]]) -> list[bool]:
    """Per spec, whether the spec rules refuse it: one request for up to PER_REQUEST specs."""
    causes = probe(client, "specrules", {f"j{i}": doc for i, doc in enumerate(docs)})
    assert not blocked_properties(causes) and spec_rule_refusals(causes) == causes, causes
    return [any(under(field, f"j{i}") for field, _, _ in causes) for i in range(len(docs))]


def test_cel_and_spec_layout_agree_on_random_specs(jobs: Api) -> None:
    rng = random.Random(16)
    specs = [random_spec(rng) for _ in range(RANDOM_SPECS)]
    rejected = 0
    for start in range(0, RANDOM_SPECS, PER_REQUEST):
        batch = specs[start:start + PER_REQUEST]
        for (doc, layout, counts, procs, storage), cel_rejects in zip(
                batch, probe_verdicts(jobs, [s[0] for s in batch]), strict=True):
            found = job_problems(layout, counts, procs) + cluster_storage_problems(storage)
            covered = [p for p in found if p.rule in COVERED_RULES]
            assert cel_rejects == bool(covered), (doc, covered)
            rejected += cel_rejects
    assert 100 < rejected < 1400  # both verdicts are well represented


def test_the_probe_decides_as_the_crd_does(jobs: Api) -> None:
    # The probe's copy of the rules judges a few random specs as the TrainingJob CRD itself does.
    docs = [random_spec(random.Random(seed))[0] for seed in range(8)]
    assert probe_verdicts(jobs, docs) == [bool(refused_by_spec_rules(jobs, d)) for d in docs]


def test_elastic_ranges_are_checked_at_every_replica_count_not_only_min_and_max(jobs: Api) -> None:
    # replicas 2..4 with tp 2: worlds 2, 3, 4; tp 2 divides 2 and 4 but not 3.
    doc, _, _, _, _ = random_spec(random.Random(0))
    doc.update(replicas={"min": 2, "max": 4}, procsPerReplica=1, checkpoint={"dir": "/ckpt", "claimName": "ckpt"})
    doc["trainer"].update(training={"globalBatch": 8, "microBatch": 1})  # type: ignore[attr-defined]
    doc["trainer"]["parallelism"].update(tp=2, pp=1, ep=1, fsdp=True)  # type: ignore[index]
    assert refused_by_spec_rules(jobs, doc) == {"spec.trainer.parallelism.tp"}
    doc["replicas"] = {"min": 2, "max": 2}
    assert refused_by_spec_rules(jobs, doc) == set()


@pytest.mark.parametrize("lo, hi", [(1, MAX_CEL_REPLICA_COUNTS), (5, 5 + MAX_CEL_REPLICA_COUNTS - 1)])
def test_the_batch_rule_reaches_the_last_count_it_claims(jobs: Api, lo: int, hi: int) -> None:
    # globalBatch 60 does not split at several counts of these ranges, the last one (64, 68) among them.
    doc = {"command": [], "replicas": {"min": lo, "max": hi}, "procsPerReplica": 1,
           "checkpoint": {"dir": "/ckpt", "claimName": "ckpt", "ephemeral": False},
           "trainer": {"model": {}, "parallelism": {"tp": 1, "pp": 1, "ep": 1, "fsdp": True, "auto": False},
                       "training": {"globalBatch": 60, "microBatch": 1}}}
    assert refused_by_spec_rules(jobs, doc) == {"spec.trainer.training.globalBatch"}


@pytest.mark.parametrize("case", STORAGE_REFUSED + STORAGE_FINE, ids=str)
def test_the_storage_rule_refuses_only_unshared_multi_worker_checkpoints(jobs: Api, case: tuple[Any, ...]) -> None:
    assert bool(refused_by_spec_rules(jobs, storage_doc(*case))) == (case in STORAGE_REFUSED)


TEMPLATE_CASES = [({"spec": {key: "x"}}, owned_field_problem(key)) for key in OWNED_POD_FIELDS] + [
    ({"metadata": {where: {"team": "a", key: "x"}}}, kueue_key_problem(where, key))
    for where in METADATA_MAPS for key in KUEUE_KEYS]


@pytest.mark.parametrize("template, message", TEMPLATE_CASES, ids=[m.split(":")[0] for _, m in TEMPLATE_CASES])
def test_operator_owned_pod_fields_and_kueue_metadata_are_refused_in_the_operators_words(
        jobs: Api, template: dict[str, Any], message: str) -> None:
    causes = jobs.dry_run(TRAININGJOBS, job(spec(template=template)))
    assert causes and all(message in text for _, text, _ in causes), causes


def test_a_template_with_none_of_them_is_taken(jobs: Api) -> None:
    fine = {"metadata": {"labels": {"team": "a"}, "annotations": {"kueue.x-k8s.io/other": "x"}},
            "spec": {"nodeSelector": {"a": "b"}}}
    for template in (fine, {}):
        assert jobs.dry_run(TRAININGJOBS, job(spec(template=template))) == [], template


@pytest.mark.parametrize("amount, taken", [(2, True), ("500m", True), ([1], False), ({"a": 1}, False), (True, False)],
                         ids=str)
def test_an_int_or_string_node_takes_an_integer_or_a_string_only(jobs: Api, amount: Any, taken: bool) -> None:
    # Quantities and ports in the CRD are int-or-string nodes: "2" and 2 alike, nothing else.
    causes = jobs.dry_run(TRAININGJOBS, job(spec(resources={"limits": {"cpu": amount}})))
    assert (causes == []) == taken, causes
    assert all(field == "spec.resources.limits.cpu" and "must be of type integer,string" in message
               for field, message, _ in causes if NOT_CHECKED not in message), causes


def test_a_named_port_is_taken_where_a_port_may_be_a_name(jobs: Api) -> None:
    probe_port = {"httpGet": {"path": "/healthz", "port": "http"}}
    container = {"name": "worker", "ports": [{"containerPort": 8080, "name": "http"}], "livenessProbe": probe_port}
    assert jobs.dry_run(TRAININGJOBS, job(spec(template={"spec": {"containers": [container]}}))) == []
