"""Every interruption shows with its cause, on the test cluster: a worker pod deleted mid-run (kubectl delete, the
default grace) is replaced, counted in status.restarts and named PodDeleted; a worker whose script fails on an
import fails the job after 2 attempts with the import error in the condition and in kubectl describe. Under the
hardened worker context (enforced by the test kubelet) a script writing outside its volumes fails with the reason in
the status, one writing /tmp, /dev/shm, the checkpoint dir and the cache home succeeds, and docs/install.md's root
override lets the failing write succeed (twins in tests/e2e_real)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.operator import worker_writes as writes
from tests.operator.conftest import LONG_STEPS, OpEnv, eventually


def test_a_pod_deleted_mid_run_counts_as_a_restart_named_pod_deleted(op_env: OpEnv) -> None:
    name = "deleted-gracefully"
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml(name)))
    eventually(lambda: op_env.last_step(name) >= 50, 120, f"{name} to pass step 50", interval=0.05)
    op_env.kubectl("delete", "pod", f"{name}-worker-1", "--wait=false")
    counted = eventually(lambda: (s := op_env.status(name)).get("restarts", 0) >= 1 and s, 60, "the restart")
    assert counted["lastRestartReason"] == "PodDeleted" and counted["restartBudget"]["used"] == 0
    status = op_env.wait_phase(name, "Succeeded", 180)
    assert status["step"] == LONG_STEPS and status["restarts"] >= 1
    assert "PodDeleted" in op_env.kubectl("describe", "tj", name).stdout
    op_env.delete(name)


def test_a_script_failing_on_an_import_fails_the_job_in_two_attempts(op_env: OpEnv) -> None:
    name = "bad-import"
    script = op_env.tmp / "bad_import.py"
    script.write_text("import flywheel_no_such_module  # noqa\n")
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, command=["python", str(script)],
                                                      **{"faultTolerance.maxRestarts": 10})))
    fails_at_start_up(op_env, name, "ModuleNotFoundError: No module named 'flywheel_no_such_module'")


def fails_at_start_up(op_env: OpEnv, name: str, words: str) -> None:
    """Job `name` fails as a StartupFailure after two attempts, `words` in its condition and `kubectl describe`."""
    status = op_env.wait_phase(name, "Failed", 120)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "StartupFailure" and words in failed["message"], failed
    assert status["restarts"] == 1 and status["startupFailure"]["attempts"] == 2
    assert words in op_env.kubectl("describe", "tj", name).stdout
    op_env.delete(name)


def test_a_failing_init_container_fails_the_job_in_two_attempts_with_its_words(op_env: OpEnv) -> None:
    """An init container from the template that fails (exit 3: its own code, not the trainer's user error): the
    job fails as a start-up failure, with what the init container said, not after maxRestarts."""
    name = "bad-init"
    fetch = {"name": "fetch", "image": "busybox:1.36", "terminationMessagePolicy": "FallbackToLogsOnError",
             "command": ["sh", "-c", "echo dataset s3://bucket/train is missing >&2; exit 3"]}
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, template={"spec": {"initContainers": [fetch]}},
                                                      **{"faultTolerance.maxRestarts": 10})))
    fails_at_start_up(op_env, name, "init container fetch failed: dataset s3://bucket/train is missing")


@pytest.fixture(scope="module")
def outside() -> Iterator[Path]:
    """A file outside every volume of the workers, on the host's root filesystem (not under /tmp: the workers' /tmp
    emptyDir is the host's /tmp here), in a directory only root may write: only the read-only root stops the
    hardened worker, and a root worker may write it."""
    directory = Path(tempfile.mkdtemp(prefix="flywheel-outside-", dir="/var/tmp"))
    assert not any(os.path.ismount(d) for d in (directory, *directory.parents) if d != Path("/")), directory
    try:
        yield directory / "written"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _finished(op_env: OpEnv, name: str) -> dict[str, Any]:
    return eventually(lambda: (s := op_env.status(name)).get("phase") in ("Succeeded", "Failed") and s, 120,
                      f"{name} to finish")


ONE_WORKER = {"replicas": {"min": 1, "max": 1}}  # one pod is enough to show what its context allows


def test_a_script_writing_outside_its_volumes_fails_under_the_hardened_context(op_env: OpEnv, outside: Path) -> None:
    """The worker's default context has a read-only root (the test kubelet enforces it as a real one does): the write
    fails, deterministically, and its reason reaches the status (twin in tests/e2e_real)."""
    name = "read-only-root"
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, command=writes.write_outside(str(outside)))))
    status = op_env.wait_phase(name, "Failed", 120)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert "Read-only file system" in failed["message"], failed
    assert not outside.exists()
    op_env.delete(name)


def test_a_script_writing_tmp_shm_the_checkpoint_dir_and_the_cache_home_succeeds_hardened(op_env: OpEnv) -> None:
    """What the hardened context leaves writable is enough: /tmp, /dev/shm, the checkpoint dir, and $HOME/.cache,
    $XDG_CACHE_HOME, $TRITON_CACHE_DIR, $TORCHINDUCTOR_CACHE_DIR as the operator sets them (the cache home)."""
    name = "writes-writable"
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, command=["python", "-c", writes.WRITE_EVERY_WRITABLE_PATH],
                                                      **ONE_WORKER)))
    status = _finished(op_env, name)
    assert status["phase"] == "Succeeded", status
    [pod] = op_env.pods(name)
    worker = pod["spec"]["containers"][0]
    assert worker["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["HOME"] == "/home/flywheel" and env["XDG_CACHE_HOME"].startswith("/home/flywheel/")
    log = op_env.kubectl("logs", pod["metadata"]["name"]).stdout
    assert all(f"wrote {what}: " in log for what in writes.WRITABLE_WHAT), log
    assert f"wrote all {len(writes.WRITABLE_WHAT)} writable paths as uid 10001" in log, log
    op_env.delete(name)


def test_the_documented_root_override_lets_the_same_write_succeed(op_env: OpEnv, outside: Path) -> None:
    """docs/install.md's NGC override, through the TrainingJob's template as a user writes it: the worker runs as
    root on a writable root filesystem (no cache home then), so the write that fails above succeeds."""
    name = "root-override"
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, command=writes.write_outside(str(outside)),
                                                      template=writes.documented_root_override(), **ONE_WORKER)))
    status = _finished(op_env, name)
    assert status["phase"] == "Succeeded", status
    assert outside.read_text() == "written"
    [pod] = op_env.pods(name)
    assert pod["spec"]["securityContext"]["runAsUser"] == 0 and "runAsNonRoot" not in pod["spec"]["securityContext"]
    worker = pod["spec"]["containers"][0]
    assert worker["securityContext"]["readOnlyRootFilesystem"] is False
    assert "cache-home" not in {v["name"] for v in pod["spec"]["volumes"]}
    op_env.delete(name)
