"""A table of invalid TrainingJobs, each refused the same way everywhere before any worker exists: by `flywheel
plan`, by `flywheel run` (non-zero exit, the message printed, no traceback, no worker started), and on the test
cluster by `kubectl apply --dry-run=server` (the CRD's schema and CEL rules) or, for what CEL cannot decide, by the
validation the operator runs before creating any pod (`parse_job`: an `Invalid` condition). Every refusal names the
field and the fix."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flywheel.cli import main
from flywheel.local.runner import RunOptions, load_checked
from flywheel.spec import SpecError, parse_cluster_job
from tests.integration.kubectl_cluster import kubectl_on_test_cluster

CRD = Path(__file__).resolve().parents[2] / "crds" / "trainingjobs.flywheel.dev.yaml"
TINY = {"preset": None, "layers": 4, "dim": 64, "heads": 4, "vocab": 256, "seqLen": 64}

# (name, spec changes, field, fix, refused by the cluster's schema/CEL: True, or by the operator's validation: False)
TABLE: list[tuple[str, dict[str, Any], str, str, bool]] = [
    ("tp-heads", {"trainer": {"model": {**TINY, "heads": 2, "dim": 64}, "parallelism": {"tp": 4}},
                  "procsPerReplica": 4}, "trainer.parallelism.tp", "divides trainer.model.heads", False),
    ("tp-heads-3", {"trainer": {"model": {**TINY, "heads": 3, "dim": 48}, "parallelism": {"tp": 2}},
                    "procsPerReplica": 2}, "trainer.parallelism.tp", "divides trainer.model.heads", False),
    ("tp-ddp", {"trainer": {"parallelism": {"tp": 2, "fsdp": False}}, "procsPerReplica": 2},
     "trainer.parallelism.fsdp", "set fsdp: true or tp: 1", True),
    ("tp-seq", {"trainer": {"model": {**TINY, "seqLen": 66}, "parallelism": {"tp": 4}}, "procsPerReplica": 4},
     "trainer.parallelism.tp", "divides trainer.model.seqLen", False),
    ("tp-world", {"trainer": {"parallelism": {"tp": 3}}}, "trainer.parallelism.tp", "product divides every world",
     True),
    ("tp-elastic", {"trainer": {"parallelism": {"tp": 2}}, "replicas": {"min": 2, "max": 4}},
     "trainer.parallelism.tp", "product divides every world", True),
    ("tp-pp-world", {"trainer": {"parallelism": {"tp": 2, "pp": 2}}, "replicas": {"min": 3, "max": 3}},
     "trainer.parallelism.tp", "product divides every world", True),
    ("pp-world", {"trainer": {"model": TINY, "parallelism": {"pp": 3}}}, "trainer.parallelism.tp",
     "product divides every world", True),
    ("pp-layers", {"trainer": {"parallelism": {"pp": 4}}, "procsPerReplica": 2}, "trainer.parallelism.pp",
     "divides trainer.model.layers", False),
    ("pp-stages-layers", {"trainer": {"model": TINY, "parallelism": {"pp": 2, "stagesPerRank": 3,
                                                                     "schedule": "interleaved-1f1b"}}},
     "trainer.parallelism.pp", "divides trainer.model.layers", False),
    ("pp-1f1b-few", {"trainer": {"model": TINY, "parallelism": {"pp": 2}, "training": {"globalBatch": 4,
                                                                                       "microBatch": 4}},
                     "replicas": {"min": 1, "max": 1}, "procsPerReplica": 2},
     "trainer.parallelism.microbatches", "raise globalBatch or microbatches", False),
    ("pp-chunked-loss", {"trainer": {"model": TINY, "parallelism": {"pp": 2}, "training": {"chunkedLoss": True}}},
     "trainer.training.chunkedLoss", "set chunkedLoss: false or pp: 1", False),
    ("pp-microbatches", {"trainer": {"model": TINY, "parallelism": {"pp": 2, "microbatches": 3}}},
     "trainer.parallelism.microbatches", "pick a divisor or leave it unset", False),
    ("pp-stages-schedule", {"trainer": {"parallelism": {"pp": 2, "stagesPerRank": 2}}},
     "trainer.parallelism.stagesPerRank", "set stagesPerRank: 1 or schedule: interleaved-1f1b", True),
    ("pp-interleaved-1", {"trainer": {"parallelism": {"pp": 2, "schedule": "interleaved-1f1b"}}},
     "trainer.parallelism.stagesPerRank", "interleaved-1f1b", True),
    ("batch-micro", {"trainer": {"training": {"globalBatch": 10, "microBatch": 4}}},
     "trainer.training.globalBatch", "multiple of microBatch", True),
    ("batch-dp", {"trainer": {"training": {"globalBatch": 12, "microBatch": 4}}},
     "trainer.training.globalBatch", "multiple of", True),
    ("batch-elastic", {"trainer": {"training": {"globalBatch": 32, "microBatch": 4}},
                       "replicas": {"min": 1, "max": 3}}, "trainer.training.globalBatch", "multiple of", True),
    ("batch-elastic-middle", {"trainer": {"training": {"globalBatch": 40, "microBatch": 1}},
                              "replicas": {"min": 2, "max": 5}, "procsPerReplica": 1},
     "trainer.training.globalBatch", "multiple of", True),
    ("batch-procs", {"trainer": {"training": {"globalBatch": 8, "microBatch": 1}}, "procsPerReplica": 3},
     "trainer.training.globalBatch", "multiple of", True),
    ("ep-dense", {"trainer": {"parallelism": {"ep": 2}}}, "trainer.parallelism.ep", "set model.moe", False),
    ("ep-experts", {"trainer": {"model": {"moe": {"experts": 6}}, "parallelism": {"ep": 4}},
                    "procsPerReplica": 2}, "trainer.parallelism.ep", "divides the number of experts", False),
    ("ep-ddp", {"trainer": {"model": {"moe": {"experts": 4}}, "parallelism": {"ep": 2, "fsdp": False}}},
     "trainer.parallelism.fsdp", "set fsdp: true or ep: 1", True),
    ("ep-dp", {"trainer": {"model": {"moe": {"experts": 8}}, "parallelism": {"ep": 8}}},
     "trainer.parallelism.ep", "divides dp at every world size", True),
    ("ep-elastic", {"trainer": {"model": {"moe": {"experts": 4}}, "parallelism": {"ep": 2},
                                "training": {"globalBatch": 24, "microBatch": 1}},
                    "replicas": {"min": 2, "max": 3}, "procsPerReplica": 1},
     "trainer.parallelism.ep", "divides dp at every world size", True),
    ("moe-pp", {"trainer": {"model": {"moe": {"experts": 4}}, "parallelism": {"pp": 2}}},
     "trainer.parallelism.pp", "use dp, tp and ep, or a dense model", False),
    ("moe-topk", {"trainer": {"model": {"moe": {"experts": 4, "topK": 5}}}}, "trainer.model.moe.topK",
     "route to at most every expert", False),
    ("moe-every", {"trainer": {"model": {"moe": {"experts": 4, "every": 3}}}}, "trainer.model.moe.every",
     "lower every", False),
    ("heads-dim", {"trainer": {"model": {**TINY, "heads": 5}}}, "trainer.model.heads",
     "pick heads that divide dim", True),
    ("heads-preset", {"trainer": {"model": {"preset": "gpt-tiny", "heads": 3}}}, "trainer.model.heads",
     "pick heads that divide dim", False),
    ("model-missing", {"trainer": {"model": {"preset": None, "layers": 2}}}, "trainer.model",
     "set a preset or give every size", False),
    ("data-vocab", {"trainer": {"model": {**TINY, "vocab": 128}, "data": {"source": "/data/corpus.txt"}}},
     "trainer.model.vocab", "at least 256", False),
    ("data-format", {"trainer": {"data": {"source": "corpus.parquet"}}}, "trainer.data.source",
     "convert the data", False),
    ("eval-no-data", {"trainer": {"training": {"evalEverySteps": 5}, "data": {"source": "/data/corpus.txt"}}},
     "trainer.training.evalEverySteps", "set data.validation", False),
    ("replicas-order", {"replicas": {"min": 3, "max": 2}}, "replicas", "set min <= max", True),
    ("replicas-target", {"replicas": {"min": 1, "max": 2, "target": 5}}, "replicas", "scale within the bounds",
     True),
    ("auto-batch", {"trainer": {"parallelism": {"auto": True, "schedule": "gpipe"},
                                "training": {"globalBatch": 7, "microBatch": 1}}},
     "trainer.training.globalBatch", "use a multiple of every world size", False),
    ("auto-elastic", {"trainer": {"parallelism": {"auto": True}, "training": {"globalBatch": 64}},
                      "replicas": {"min": 2, "max": 3}, "procsPerReplica": 4},
     "trainer.training.globalBatch", "use a multiple of every world size", False),
    ("auto-memory", {"trainer": {"model": {"preset": "gpt-1.3b"}, "parallelism": {"auto": True},
                                 "training": {"globalBatch": 2, "microBatch": 1}}, "replicas": {"min": 1, "max": 1},
                     "procsPerReplica": 1}, "trainer.parallelism.device", "a device with more memory", False),
    ("auto-model", {"trainer": {"model": {**TINY, "heads": 3}, "parallelism": {"auto": True}}},
     "trainer.model.heads", "pick heads that divide dim", True),
    ("auto-data", {"trainer": {"model": {**TINY, "vocab": 100}, "parallelism": {"auto": True},
                               "data": {"source": "/data/t.txt"}}}, "trainer.model.vocab", "at least 256", False),
    ("auto-schedule", {"trainer": {"parallelism": {"auto": True, "stagesPerRank": 2}}},
     "trainer.parallelism.stagesPerRank", "set stagesPerRank: 1 or schedule: interleaved-1f1b", True),
    # spec.template: what the operator owns in the worker pod, and shorthands that disagree with the template.
    ("template-restart-policy", {"template": {"spec": {"restartPolicy": "OnFailure"}}},
     "template.spec.restartPolicy", "use spec.faultTolerance (maxRestarts, restartScope)", True),
    ("template-hostname", {"template": {"spec": {"hostname": "h", "subdomain": "s"}}}, "template.spec.hostname",
     "remove it (workers are <job>-worker-<index>)", True),
    ("template-kueue-queue", {"template": {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "q"}}}},
     "template.metadata.labels.kueue.x-k8s.io/queue-name", "set spec.scheduling.queue", True),
    ("template-kueue-count", {"template": {"metadata": {"annotations": {"kueue.x-k8s.io/pod-group-total-count": "2"}}}},
     "template.metadata.annotations.kueue.x-k8s.io/pod-group-total-count", "set spec.scheduling.queue", True),
    ("template-gang-scheduler", {"template": {"spec": {"schedulerName": "other"}}}, "scheduling.gang",
     "template.spec.schedulerName 'other' would replace", False),
    ("template-command", {"template": {"spec": {"containers": [{"name": "worker", "command": ["torchrun"]}]}}},
     "template.spec.containers[0].command", "put your entrypoint in spec.command", False),
    ("template-contract-env", {"template": {"spec": {"containers": [{"name": "worker", "env": [
        {"name": "WORLD_SIZE", "value": "8"}]}]}}}, "template.spec.containers[0].env[0].name",
     "belongs to the worker contract", False),
    ("template-volume", {"template": {"spec": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}},
     "template.spec.volumes[0].name", "rename yours", True),
    ("template-mount-path", {"template": {"spec": {"containers": [{"name": "worker", "volumeMounts": [
        {"name": "data", "mountPath": "/dev/shm"}]}], "volumes": [{"name": "data", "emptyDir": {}}]}}},
     "template.spec.containers[0].volumeMounts[0].mountPath", "mount yours elsewhere", False),
    ("template-image", {"image": "team/trainer:1", "template": {"spec": {"containers": [
        {"name": "worker", "image": "team/trainer:2"}]}}}, "image", "set the image in one place", False),
    ("accelerator-count", {"accelerator": {"resource": "nvidia.com/gpu"}, "resources": {
        "limits": {"nvidia.com/gpu": 2}}}, "resources.limits.nvidia.com/gpu", "or set procsPerReplica: 2", False),
]


def document(name: str, changes: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"replicas": {"min": 2, "max": 2}, "trainer": {"training": {"steps": 2}},
                            "checkpoint": {"claimName": "shared-ckpt"}}
    for key, value in changes.items():
        if key == "trainer":
            for section, fields in value.items():
                spec["trainer"][section] = {**spec["trainer"].get(section, {}), **fields}
        else:
            spec[key] = value
    return {"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name}, "spec": spec}


def names_field_and_fix(text: str, field: str, fix: str) -> bool:
    flat = " ".join(text.split())
    return field in flat and fix in flat


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(list(argv))
    return code, out.getvalue()


def test_the_table_is_big_and_varied():
    assert len(TABLE) >= 40 and len({row[0] for row in TABLE}) == len(TABLE)


@pytest.mark.parametrize("name, changes, field, fix, by_cel", TABLE, ids=[row[0] for row in TABLE])
def test_plan_run_and_the_operator_refuse_it(tmp_path, name, changes, field, fix, by_cel):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(document(name, changes)))
    code, text = cli("plan", str(job))
    assert code != 0 and "Traceback" not in text and names_field_and_fix(text, field, fix), text
    out = tmp_path / "out"
    code, text = cli("run", str(job), "--out", str(out), "--no-progress")
    assert code != 0 and "Traceback" not in text and names_field_and_fix(text, field, fix), text
    assert not out.exists()  # refused before the run directory, the store or any worker
    with pytest.raises(SpecError) as refused:  # the operator's own validation: Invalid before any pod
        parse_cluster_job(document(name, changes))
    assert names_field_and_fix(str(refused.value), "spec." + field, fix), str(refused.value)


@pytest.fixture(scope="module")
def kubectl() -> Iterator[Any]:
    with kubectl_on_test_cluster(CRD) as run:
        yield run


@pytest.mark.parametrize("name, changes, field, fix, by_cel", [r for r in TABLE if r[4]],
                         ids=[r[0] for r in TABLE if r[4]])
def test_kubectl_apply_refuses_what_cel_decides(kubectl, name, changes, field, fix, by_cel):
    result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(document(name, changes)))
    assert result.returncode != 0 and names_field_and_fix(result.stderr, field, fix), result.stderr


def test_kubectl_accepts_a_valid_job(kubectl):
    result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(document("fine", {})))
    assert result.returncode == 0, result.stderr


UNSHARED = {"replicas": {"min": 1, "max": 2}, "checkpoint": {"dir": "/ckpt/x"}}


def test_the_operator_refuses_workers_without_a_shared_checkpoint_but_the_local_runner_runs_them(tmp_path):
    with pytest.raises(SpecError) as refused:
        parse_cluster_job(document("unshared", UNSHARED))
    assert names_field_and_fix(str(refused.value), "spec.checkpoint.claimName", "checkpoint.ephemeral: true")
    for fine in ({"checkpoint": {"dir": "/ckpt/x", "ephemeral": True}}, {"replicas": {"min": 1, "max": 1}},
                 {"checkpoint": {"dir": "s3://bucket/run"}}):
        parse_cluster_job(document("fine", {**UNSHARED, **fine}))
    # One machine: every worker writes to the same directory, so `flywheel run` accepts the job.
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(document("unshared", {**UNSHARED, "checkpoint": {"dir": str(tmp_path / "c")}})))
    assert load_checked(RunOptions(job_file=str(job)))[0].spec.replicas.max == 2


def test_kubectl_apply_refuses_workers_without_a_shared_checkpoint(kubectl):
    result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(document("unshared", UNSHARED)))
    assert result.returncode != 0 and names_field_and_fix(result.stderr, "checkpoint.claimName",
                                                          "checkpoint.ephemeral: true"), result.stderr
    ephemeral = {**UNSHARED, "checkpoint": {"dir": "/ckpt/x", "ephemeral": True}}
    result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(document("ephemeral", ephemeral)))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name, changes, field, fix, by_cel", [r for r in TABLE if not r[4]],
                         ids=[r[0] for r in TABLE if not r[4]])
def test_what_cel_cannot_decide_passes_apply(kubectl, name, changes, field, fix, by_cel):
    """The table says who refuses each row: a row left to the operator's validation is one the API server accepts
    (else the e2e twin, which applies it and waits for Invalid, would meet a refusal at apply instead)."""
    result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(document(name, changes)))
    assert result.returncode == 0, f"refused at apply: mark the row as decided by CEL: {result.stderr}"
