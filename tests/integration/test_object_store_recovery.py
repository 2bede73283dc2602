"""End to end through `flywheel run` with `checkpoint.dir: s3://...` against an S3-compatible server (moto) on
localhost, reached by the workers through s3fs and the standard AWS_* environment, as a user's S3 would be: a run
whose rank is killed (no restarts left: the job fails) leaves its checkpoints in the bucket; with the local staging
tier wiped (the pods and their emptyDirs gone), the next run downloads the newest committed step and finishes with
per-step losses and final parameters bitwise equal to an uninterrupted run's."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

from tests.integration.test_exact_recovery import _logs, flywheel_run, job_doc
from tests.s3_server import s3_server, use_server

pytestmark = pytest.mark.slow
BUCKET, URL = "flywheel-ckpt", "s3://flywheel-ckpt/jobs/s3"


@pytest.mark.heavy
def test_a_killed_s3_run_resumes_bitwise_from_the_bucket_after_the_local_tier_is_wiped(tmp_path, monkeypatch):
    # 40 steps, the kill at 34: the uploads run behind the loop, and one under way when a loaded host reaches the
    # kill is lost with the run (an earlier kill, at 18 of 24, once found the bucket still empty).
    ref, result = flywheel_run(tmp_path / "ref", job_doc("ref", tmp_path / "ref-ckpt", fsdp=False, steps=40))
    assert result.returncode == 0 and ref["status"] == "Succeeded", _logs(tmp_path / "ref")

    from flywheel.trainer.checkpoint.tiers.bucket import RemoteStore

    staging = tmp_path / "staging"
    doc = job_doc("s3", tmp_path / "unused", fsdp=False, steps=40)
    doc["spec"]["checkpoint"] = {"dir": URL, "localDir": str(staging), "everySteps": 5, "keep": 2}
    with s3_server() as env:
        use_server(env, monkeypatch, BUCKET)  # the workers inherit this environment
        failing = copy.deepcopy(doc)
        failing["spec"]["faultTolerance"]["maxRestarts"] = 0
        first, result = flywheel_run(tmp_path / "a", failing, "kill:rank=1:step=34")
        assert first["status"] == "Failed", _logs(tmp_path / "a")
        in_bucket = [r.step for r in RemoteStore(URL).committed()]
        # Uploads run behind the loop: the newest step in the bucket may trail the newest local one.
        assert in_bucket and 5 <= in_bucket[-1] < 34, in_bucket
        shutil.rmtree(staging)

        second, result = flywheel_run(tmp_path / "b", doc)
        assert result.returncode == 0 and second["status"] == "Succeeded", _logs(tmp_path / "b")
        assert RemoteStore(URL).committed()[-1].step == 40  # the final save is in the bucket when the run ends
    events = [json.loads(line) for line in (tmp_path / "b" / "out" / "events.jsonl").read_text().splitlines()]
    [restore] = [e for e in events if e["event"] == "restore"]
    assert restore["step"] == in_bucket[-1] and restore["path"].startswith(str(staging))
    assert second["final_params_sha256"] == ref["final_params_sha256"] is not None
    k = restore["step"]
    assert second["losses"][k:] == ref["losses"][k:] and len(second["losses"]) == len(ref["losses"])
