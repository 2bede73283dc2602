"""The CRD's CEL layout and checkpoint-storage rules agree with the one definition (spec_layout.py): on many
random small specs, the CEL rules (evaluated by the test cluster's CEL evaluator) reject exactly when spec_layout
finds a problem of a rule they cover (crd.COVERED_RULES), at every replica count in [min, max]."""

from __future__ import annotations

import random

import pytest

from flywheel.crd import COVERED_RULES, MAX_CEL_REPLICA_COUNTS, build_crd
from flywheel.planner.devices import DEVICES
from flywheel.spec_layout import CheckpointStorage, JobLayout, cluster_storage_problems, job_problems, static_problems
from flywheel.spec_parallel import DEVICE_KINDS
from tests.k8s_emulator import cel

SPEC_RULES = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
    "x-kubernetes-validations"]


def random_spec(rng: random.Random) -> tuple[dict[str, object], JobLayout, range, int, CheckpointStorage]:
    lo = rng.randint(1, 4)
    hi = lo + rng.choice([0, 0, 1, 2, 3])
    procs, tp, pp = rng.choice([1, 2, 3, 4]), rng.choice([1, 1, 2, 3, 4]), rng.choice([1, 1, 2])
    moe = rng.random() < 0.3
    ep = rng.choice([1, 2, 4]) if moe else 1
    fsdp, mb = rng.random() < 0.8, rng.choice([1, 2, 3, 4])
    gb = mb * rng.choice([1, 2, 3, 4, 6, 8, 12])
    storage = CheckpointStorage(replicas_max=hi, claim_name=rng.choice(["", "", "ckpt"]),
                                directory=rng.choice(["/ckpt", "/ckpt", "s3://bucket/run", "gs://b/p", "file:///ckpt"]),
                                ephemeral=rng.random() < 0.2)
    doc: dict[str, object] = {
        "command": [], "replicas": {"min": lo, "max": hi}, "procsPerReplica": procs,
        "checkpoint": {"dir": storage.directory, "claimName": storage.claim_name, "ephemeral": storage.ephemeral},
        "trainer": {"model": {**({"moe": {"experts": 8, "topK": 2}} if moe else {})},
                    "parallelism": {"tp": tp, "pp": pp, "ep": ep, "fsdp": fsdp, "auto": False},
                    "training": {"globalBatch": gb, "microBatch": mb}}}
    job = JobLayout(layers=12, dim=96, heads=12, vocab=256, seq_len=48, experts=8 if moe else 0,
                    top_k=2 if moe else 0, tp=tp, pp=pp, ep=ep, fsdp=fsdp, global_batch=gb, micro_batch=mb)
    return doc, job, range(lo, hi + 1), procs, storage


def cel_rejects(doc: dict[str, object]) -> bool:
    return not all(cel.evaluate(rule["rule"], doc) for rule in SPEC_RULES)


def test_cel_and_spec_layout_agree_on_random_specs():
    rng = random.Random(16)
    rejected = 0
    for _ in range(1500):
        doc, job, counts, procs, storage = random_spec(rng)
        found = job_problems(job, counts, procs) + cluster_storage_problems(storage)
        covered = [p for p in found if p.rule in COVERED_RULES]
        assert cel_rejects(doc) == bool(covered), (doc, covered)
        rejected += bool(covered)
    assert 100 < rejected < 1400  # both verdicts are well represented


def test_elastic_ranges_are_checked_at_every_replica_count_not_only_min_and_max():
    # replicas 2..4 with tp 2: worlds 2, 3, 4; tp 2 divides 2 and 4 but not 3.
    doc, job, _, _, _ = random_spec(random.Random(0))
    doc.update(replicas={"min": 2, "max": 4}, procsPerReplica=1)
    doc["trainer"]["parallelism"].update(tp=2, pp=1, ep=1, fsdp=True)  # type: ignore[index]
    assert cel_rejects(doc)
    assert [p.rule for p in job_problems(JobLayout(layers=2, dim=64, heads=4, vocab=256, seq_len=64, tp=2,
                                                   global_batch=8, micro_batch=1), range(2, 5), 1)] == ["mesh"]


@pytest.mark.parametrize("lo, hi", [(1, MAX_CEL_REPLICA_COUNTS), (5, 5 + MAX_CEL_REPLICA_COUNTS - 1)])
def test_the_batch_rule_reaches_the_last_count_it_claims(lo, hi):
    # globalBatch 60 splits at every dp except the last count of the range (hi, prime to 60 for these ranges).
    doc = {"command": [], "replicas": {"min": lo, "max": hi}, "procsPerReplica": 1,
           "checkpoint": {"dir": "/ckpt", "claimName": "ckpt", "ephemeral": False},
           "trainer": {"model": {}, "parallelism": {"tp": 1, "pp": 1, "ep": 1, "fsdp": True, "auto": False},
                       "training": {"globalBatch": 60, "microBatch": 1}}}
    assert cel_rejects(doc)


def test_static_rules_the_cel_rules_do_not_cover_are_named():
    assert {"tp-heads", "tp-seq", "pp-layers", "ep-experts"}.isdisjoint(COVERED_RULES)  # need the preset's sizes
    job = JobLayout(layers=2, dim=48, heads=3, vocab=256, seq_len=64, tp=2)
    assert [p.rule for p in static_problems(job)] == ["tp-heads"]


def test_device_kinds_are_the_planners_built_in_devices():
    assert set(DEVICE_KINDS) == set(DEVICES)


def test_the_storage_rule_refuses_only_unshared_multi_worker_checkpoints():
    def verdict(replicas_max: int, claim: str, directory: str, ephemeral: bool) -> tuple[bool, bool]:
        storage = CheckpointStorage(replicas_max, claim, directory, ephemeral)
        doc = {"command": [], "replicas": {"min": 1, "max": replicas_max}, "procsPerReplica": 1,
               "checkpoint": {"dir": directory, "claimName": claim, "ephemeral": ephemeral},
               "trainer": {"model": {}, "parallelism": {"tp": 1, "pp": 1, "ep": 1, "fsdp": True, "auto": False},
                           "training": {"globalBatch": 60, "microBatch": 1}}}
        return cel_rejects(doc), bool(cluster_storage_problems(storage))

    for refused in [(2, "", "/ckpt", False), (2, "", "file:///ckpt", False), (3, "", "FILE:///ckpt", False),
                    (2, "", "local:///ckpt", False)]:  # fsspec's names for the local disk are paths
        assert verdict(*refused) == (True, True), refused
    for fine in [(1, "", "/ckpt", False), (2, "ckpt", "/ckpt", False), (2, "", "/ckpt", True),
                 (3, "", "s3://bucket/prefix", False), (3, "", "S3://bucket/prefix", False),
                 (2, "", "gs://b/p", False)]:
        assert verdict(*fine) == (False, False), fine
