"""The one definition of the layout and checkpoint-storage rules (layout/rules.py) on the random small specs and the
storage table that tests/k8s/test_crd_rules_server.py sends to a real API server, whose verdicts from the CRD's CEL
rules must agree with these (crd.COVERED_RULES); and what the CEL rules leave to Python."""

from __future__ import annotations

import random

from flywheel.layout.rules import JobLayout, job_problems, static_problems
from flywheel.planner.devices import DEVICES
from flywheel.spec.crd.generate import COVERED_RULES
from flywheel.spec.parallel import DEVICE_KINDS
from flywheel.spec.storage import CheckpointStorage, cluster_storage_problems

# (replicas.max, checkpoint.claimName, checkpoint.dir, checkpoint.ephemeral)
STORAGE_REFUSED = [(2, "", "/ckpt", False), (2, "", "file:///ckpt", False), (3, "", "FILE:///ckpt", False),
                   (2, "", "local:///ckpt", False)]  # fsspec's names for the local disk are paths
STORAGE_FINE = [(1, "", "/ckpt", False), (2, "ckpt", "/ckpt", False), (2, "", "/ckpt", True),
                (3, "", "s3://bucket/prefix", False), (3, "", "S3://bucket/prefix", False), (2, "", "gs://b/p", False)]


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


def test_spec_layout_verdicts_on_random_specs_are_varied():
    # The server's test asserts agreement on these specs; it means something only if both verdicts are common.
    rng = random.Random(16)
    rejected = 0
    for _ in range(1500):
        _, job, counts, procs, storage = random_spec(rng)
        found = job_problems(job, counts, procs) + cluster_storage_problems(storage)
        rejected += any(p.rule in COVERED_RULES for p in found)
    assert 100 < rejected < 1400


def test_an_elastic_range_is_refused_for_a_count_between_min_and_max():
    # replicas 2..4 with tp 2: worlds 2, 3, 4; tp 2 divides 2 and 4 but not 3.
    assert [p.rule for p in job_problems(JobLayout(layers=2, dim=64, heads=4, vocab=256, seq_len=64, tp=2,
                                                   global_batch=8, micro_batch=1), range(2, 5), 1)] == ["mesh"]


def test_static_rules_the_cel_rules_do_not_cover_are_named():
    assert {"tp-heads", "tp-seq", "pp-layers", "ep-experts"}.isdisjoint(COVERED_RULES)  # need the preset's sizes
    job = JobLayout(layers=2, dim=48, heads=3, vocab=256, seq_len=64, tp=2)
    assert [p.rule for p in static_problems(job)] == ["tp-heads"]


def test_device_kinds_are_the_planners_built_in_devices():
    assert set(DEVICE_KINDS) == set(DEVICES)


def storage_doc(replicas_max: int, claim: str, directory: str, ephemeral: bool) -> dict[str, object]:
    """A spec that only the storage rule may refuse."""
    return {"command": [], "replicas": {"min": 1, "max": replicas_max}, "procsPerReplica": 1,
            "checkpoint": {"dir": directory, "claimName": claim, "ephemeral": ephemeral},
            "trainer": {"model": {}, "parallelism": {"tp": 1, "pp": 1, "ep": 1, "fsdp": True, "auto": False},
                        "training": {"globalBatch": 60, "microBatch": 1}}}


def test_the_storage_rule_refuses_only_unshared_multi_worker_checkpoints():
    for case in STORAGE_REFUSED + STORAGE_FINE:
        assert bool(cluster_storage_problems(CheckpointStorage(*case))) == (case in STORAGE_REFUSED), case
