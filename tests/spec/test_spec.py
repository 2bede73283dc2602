"""TrainingJob validation: good specs parse with defaults; bad ones are rejected with a message naming the field."""

import pytest

from flywheel.spec import API_VERSION, SpecError, TrainingJobSpec, load_job, parse_job, parse_spec
from flywheel.spec.parse import check_local_paths, spec_to_env_json
from tests.builders import job_doc, with_paths

BASE = job_doc({"replicas": {"min": 2, "max": 2}, "procsPerReplica": 2,
                "trainer": {"training": {"steps": 10, "globalBatch": 16, "microBatch": 2}}}, name="gpt-tiny")


def job_with(path: str, value):
    """BASE with one dotted path ("spec.replicas.min") set."""
    return with_paths(BASE, **{path: value})


def test_defaults_fill_a_minimal_job():
    job = parse_job({"apiVersion": API_VERSION, "kind": "TrainingJob", "metadata": {"name": "x"}})
    assert job.metadata.namespace == "default"
    assert job.spec.replicas.min == job.spec.replicas.max == 1
    assert job.spec.trainer.model.resolved() == {"layers": 2, "dim": 64, "heads": 4, "vocab": 256, "seqLen": 64}
    assert job.spec.checkpoint.async_ is True and job.spec.checkpoint.keep == 3
    assert job.spec.fault_tolerance.max_restarts == 10


def test_explicit_sizes_override_the_preset():
    job = parse_job(job_with("spec.trainer.model", {"preset": "gpt-125m", "layers": 2, "seqLen": 128}))
    assert job.spec.trainer.model.resolved() == {"layers": 2, "dim": 768, "heads": 12, "vocab": 50304, "seqLen": 128}


def test_spec_round_trips_through_the_worker_env():
    job = parse_job(BASE)
    import json
    again = parse_spec(json.loads(spec_to_env_json(job.spec)))
    assert again == job.spec
    assert isinstance(again, TrainingJobSpec)


def test_elastic_world_sizes():
    doc = job_with("spec.replicas", {"min": 1, "max": 4})
    with pytest.raises(SpecError, match="at 3 replicas; make globalBatch a multiple of 12"):
        parse_job(doc)  # the global batch stays fixed across resizes, so it must split at every dp size
    doc["spec"]["trainer"]["training"]["globalBatch"] = 48
    job = parse_job(doc)
    assert list(job.spec.world_sizes()) == [2, 4, 6, 8]
    assert job.spec.replicas.desired == 4


# (path, value, substring that must appear in the message: the field, and the fix where there is one)
INVALID = [
    ("apiVersion", "flywheel.dev/v2", "apiVersion"),
    ("kind", "PyTorchJob", "kind"),
    ("metadata.name", "Bad_Name", "metadata.name"),
    ("metadata.name", "x" * 60, "metadata.name"),
    ("spec.replicas", {"min": 3, "max": 2}, "spec.replicas: min (3) is greater than max (2)"),
    ("spec.replicas", {"min": 0, "max": 2}, "spec.replicas.min"),
    ("spec.replicas", {"min": 1, "max": 2, "target": 5}, "target (5) is outside"),
    ("spec.procsPerReplica", 0, "spec.procsPerReplica"),
    ("spec.trainer.model", {"preset": "gpt-9000"}, "spec.trainer.model.preset: unknown preset 'gpt-9000'"),
    ("spec.trainer.model", {"preset": None, "layers": 2}, "spec.trainer.model: no preset and missing"),
    ("spec.trainer.model", {"preset": None, "layers": 2, "dim": 30, "heads": 4, "vocab": 256, "seqLen": 16},
     "dim (30) is not divisible by heads (4)"),
    ("spec.trainer.model.layers", 0, "spec.trainer.model.layers"),
    ("spec.trainer.parallelism", {"tp": 3},
     "spec.trainer.parallelism.tp: tp x pp = 3 x 1 does not divide the world size 4"),
    ("spec.trainer.parallelism", {"tp": 2, "pp": 4}, "tp x pp = 2 x 4 does not divide"),
    ("spec.trainer.parallelism.microbatches", 0, "spec.trainer.parallelism.microbatches"),
    ("spec.trainer.parallelism", {"pp": 4}, "spec.trainer.parallelism.pp: 2 layers do not split evenly into pp x "
                                            "stagesPerRank = 4 stages"),
    ("spec.trainer.parallelism", {"pp": 2, "stagesPerRank": 2}, "stagesPerRank: 2 stages per rank need schedule: "
                                                                "interleaved-1f1b"),
    ("spec.trainer.parallelism", {"pp": 2, "microbatches": 3}, "spec.trainer.parallelism.microbatches: 3 does not "
                                                               "divide"),
    ("spec.trainer.parallelism.schedule", "zero-bubble", "spec.trainer.parallelism.schedule"),
    ("spec.trainer.training", {"globalBatch": 10, "microBatch": 4},
     "spec.trainer.training.globalBatch: 10 is not divisible by microBatch (4)"),
    ("spec.trainer.training", {"globalBatch": 12, "microBatch": 2},
     "spec.trainer.training.globalBatch: 12 is not divisible by microBatch x dp"),
    ("spec.trainer.training.steps", 0, "spec.trainer.training.steps"),
    ("spec.trainer.training.lr", -1.0, "spec.trainer.training.lr"),
    ("spec.trainer.training.precision", "fp8", "spec.trainer.training.precision"),
    ("spec.trainer.data.source", "corpus.parquet", "spec.trainer.data.source"),
    ("spec.checkpoint.keep", 0, "spec.checkpoint.keep"),
    ("spec.checkpoint.everySteps", -5, "spec.checkpoint.everySteps"),
    ("spec.checkpoint.async", "sometimes", "spec.checkpoint.async"),
    ("spec.faultTolerance.maxRestarts", -1, "spec.faultTolerance.maxRestarts"),
    ("spec.faultTolerance.restartScope", "node", "spec.faultTolerance.restartScope"),
    ("spec.faultTolerance.progressTimeoutSeconds", -1, "spec.faultTolerance.progressTimeoutSeconds"),
    ("spec.runPolicy.activeDeadlineSeconds", 0, "spec.runPolicy.activeDeadlineSeconds"),
    ("spec.replicaz", 2, "spec.replicaz: unknown field"),
    ("spec.trainer.training.globalbatch", 8, "spec.trainer.training.globalbatch: unknown field"),
]


@pytest.mark.parametrize("path,value,expected", INVALID, ids=[f"{p}={v!r}"[:60] for p, v, _ in INVALID])
def test_invalid_spec_is_rejected_naming_the_field(path, value, expected):
    with pytest.raises(SpecError) as err:
        parse_job(job_with(path, value))
    assert expected in str(err.value), str(err.value)


def test_enough_invalid_cases():
    assert len(INVALID) >= 20


def test_several_problems_are_reported_together():
    doc = job_with("spec.procsPerReplica", 0)
    doc["spec"]["checkpoint"] = {"keep": 0}
    with pytest.raises(SpecError) as err:
        parse_job(doc)
    assert len(err.value.problems) == 2


def test_user_command_skips_trainer_layout_checks():
    doc = job_with("spec.trainer.training", {"globalBatch": 10, "microBatch": 4})
    doc["spec"]["command"] = ["python", "train.py"]
    assert parse_job(doc).spec.command == ["python", "train.py"]


def test_load_job_reports_yaml_and_missing_files(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        load_job(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_job(bad)
    bad.write_text("- a list")
    with pytest.raises(SpecError, match="expected a mapping"):
        load_job(bad)


def test_local_paths_checked(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    doc = job_with("spec.checkpoint", {"dir": str(blocker / "ckpt")})
    doc["spec"]["trainer"]["data"] = {"source": str(tmp_path / "missing.txt")}
    with pytest.raises(SpecError) as err:
        check_local_paths(parse_job(doc))
    text = str(err.value)
    assert "spec.trainer.data.source" in text and "spec.checkpoint.dir" in text
    ok = job_with("spec.checkpoint", {"dir": str(tmp_path / "new" / "ckpt")})
    check_local_paths(parse_job(ok))


def test_missing_validation_data_is_refused_before_any_worker_starts(tmp_path):
    source = tmp_path / "train.txt"
    source.write_text("hello world " * 50)
    doc = job_with("spec.checkpoint", {"dir": str(tmp_path / "ckpt")})
    doc["spec"]["trainer"]["data"] = {"source": str(source), "validation": str(tmp_path / "held-out.txt")}
    with pytest.raises(SpecError) as err:
        check_local_paths(parse_job(doc))
    assert "spec.trainer.data.validation" in str(err.value) and "does not exist" in str(err.value)
    (tmp_path / "held-out.txt").write_text("held out " * 50)
    check_local_paths(parse_job(doc))
