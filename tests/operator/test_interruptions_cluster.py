"""Every interruption shows with its cause, on the test cluster: a worker pod deleted mid-run (kubectl delete, the
default grace) is replaced, counted in status.restarts and named PodDeleted; a worker whose script fails on an
import fails the job after 2 attempts with the import error in the condition and in kubectl describe."""

from __future__ import annotations

from tests.operator.conftest import OpEnv, eventually

LONG = {"trainer.training.steps": 400, "checkpoint.everySteps": 20}


def test_a_pod_deleted_mid_run_counts_as_a_restart_named_pod_deleted(op_env: OpEnv) -> None:
    name = "deleted-gracefully"
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, **LONG)))
    eventually(lambda: op_env.last_step(name) >= 50, 120, f"{name} to pass step 50", interval=0.05)
    op_env.kubectl("delete", "pod", f"{name}-worker-1", "--wait=false")
    counted = eventually(lambda: (s := op_env.status(name)).get("restarts", 0) >= 1 and s, 60, "the restart")
    assert counted["lastRestartReason"] == "PodDeleted" and counted["restartBudget"]["used"] == 0
    status = op_env.wait_phase(name, "Succeeded", 180)
    assert status["step"] == 400 and status["restarts"] >= 1
    assert "PodDeleted" in op_env.kubectl("describe", "tj", name).stdout
    op_env.delete(name)


def test_a_pod_force_deleted_with_grace_0_counts_as_pod_deleted(op_env: OpEnv) -> None:
    """Gone before the operator could see it Terminating: still counted, still named PodDeleted."""
    name = "deleted-forcibly"
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, **LONG)))
    eventually(lambda: op_env.last_step(name) >= 50, 120, f"{name} to pass step 50", interval=0.05)
    op_env.kubectl("delete", "pod", f"{name}-worker-1", "--grace-period=0", "--force")
    counted = eventually(lambda: (s := op_env.status(name)).get("restarts", 0) >= 1 and s, 60, "the restart")
    assert counted["lastRestartReason"] == "PodDeleted" and counted["restartBudget"]["used"] == 0
    status = op_env.wait_phase(name, "Succeeded", 180)
    assert status["step"] == 400 and status["restarts"] == 1
    op_env.delete(name)


def test_a_script_failing_on_an_import_fails_the_job_in_two_attempts(op_env: OpEnv) -> None:
    name = "bad-import"
    script = op_env.tmp / "bad_import.py"
    script.write_text("import flywheel_no_such_module  # noqa\n")
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, command=["python", str(script)],
                                                      **{"faultTolerance.maxRestarts": 10})))
    status = op_env.wait_phase(name, "Failed", 120)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "StartupFailure", failed
    assert "ModuleNotFoundError: No module named 'flywheel_no_such_module'" in failed["message"], failed
    assert status["restarts"] == 1 and status["startupFailure"]["attempts"] == 2
    assert "No module named 'flywheel_no_such_module'" in op_env.kubectl("describe", "tj", name).stdout
    op_env.delete(name)


def test_a_script_writing_outside_its_volumes_fails_under_the_hardened_context(op_env: OpEnv) -> None:
    """The worker's default context has a read-only root (the test kubelet enforces it as a real one does): the write
    fails, deterministically, and its reason reaches the status (twin in tests/e2e_real)."""
    name = "read-only-root"
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, command=["python", "-c",
                                                                     "open('/opt/flywheel-e2e', 'w')"])))
    status = op_env.wait_phase(name, "Failed", 120)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert "Read-only file system" in failed["message"], failed
    op_env.delete(name)
