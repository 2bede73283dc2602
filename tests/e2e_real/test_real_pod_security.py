"""Real-cluster twins of the worker-context and scheduling-template scenarios (see conftest.py for the settings;
skipped without KUBECONFIG):

- tests/operator/test_interruptions_cluster.py: under the default (hardened) context a worker writes /tmp, /dev/shm,
  the checkpoint dir and the cache home ($HOME/.cache, $XDG_CACHE_HOME, $TRITON_CACHE_DIR, $TORCHINDUCTOR_CACHE_DIR)
  and succeeds; docs/install.md's root override, applied through spec.template, lets a write into the image's own
  tree (/opt) succeed where the default fails it (that failure: test_real_operator.py).
- tests/operator/test_pod_template_cluster.py: a template with a nodeSelector, a PriorityClass, env from a Secret and
  the user's own scheduling gate waits gated (not failed) past pendingTimeoutSeconds and runs once the gate is
  removed. It creates the cluster-scoped PriorityClass `flywheel-test-high` (value 1000, preemptionPolicy Never: it
  evicts nothing), so the user needs cluster rights for PriorityClasses. `FLYWHEEL_E2E_RUNTIME_HANDLER` (e.g. `runc`,
  a handler the nodes' container runtime has) adds a RuntimeClass `flywheel-test-<handler>` and runs the job with
  it; `FLYWHEEL_E2E_HOST_NETWORK=1` runs it on the host network (`dnsPolicy: ClusterFirstWithHostNet`; the workers'
  ports must be free on their nodes).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import yaml

from tests.e2e_real.conftest import RealCluster, eventually
from tests.operator import test_pod_template_cluster as tmpl
from tests.operator import worker_writes as writes

ONE_WORKER = {"replicas": {"min": 1, "max": 1}}


def _finished(real: RealCluster, name: str, timeout: float = 600) -> dict[str, Any]:
    return eventually(lambda: (s := real.status(name)).get("phase") in ("Succeeded", "Failed") and s, timeout,
                      f"{name} to finish")


def test_a_script_writing_tmp_shm_the_checkpoint_dir_and_the_cache_home_succeeds_hardened(real: RealCluster,
                                                                                         tmp_path: Path) -> None:
    name = "e2e-writable"
    real.apply_job(name, tmp_path, command=["python", "-c", writes.WRITE_EVERY_WRITABLE_PATH], **ONE_WORKER)
    status = _finished(real, name)
    assert status["phase"] == "Succeeded", status
    [pod] = real.pods(name)
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    log = real.kubectl("logs", pod["metadata"]["name"]).stdout
    assert all(f"wrote {what}: " in log for what in writes.WRITABLE_WHAT), log
    assert f"wrote all {len(writes.WRITABLE_WHAT)} writable paths as uid 10001" in log, log


def test_the_documented_root_override_lets_the_out_of_path_write_succeed(real: RealCluster, tmp_path: Path) -> None:
    """The same write as test_real_operator.py's read-only-root scenario (which fails it), with docs/install.md's
    override: root on a writable root filesystem."""
    name = "e2e-root-override"
    real.apply_job(name, tmp_path, command=writes.write_outside("/opt/flywheel-e2e"),
                   template=writes.documented_root_override(), **ONE_WORKER)
    status = _finished(real, name)
    assert status["phase"] == "Succeeded", status
    [pod] = real.pods(name)
    assert pod["spec"]["securityContext"]["runAsUser"] == 0
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False


def _apply_objects(real: RealCluster, tmp_path: Path, objects: list[dict[str, Any]]) -> None:
    path = tmp_path / "prerequisites.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    real.kubectl("apply", "-f", str(path))


def test_a_gated_templated_job_with_secrets_and_a_priority_class_waits_then_runs(real: RealCluster,
                                                                                 tmp_path: Path) -> None:
    name = "e2e-tmpl-sched"
    handler = os.environ.get("FLYWHEEL_E2E_RUNTIME_HANDLER", "")
    if handler and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", handler):
        raise AssertionError(f"FLYWHEEL_E2E_RUNTIME_HANDLER={handler!r} is not a DNS label")
    host_network = os.environ.get("FLYWHEEL_E2E_HOST_NETWORK", "") == "1"
    _apply_objects(real, tmp_path, tmpl.scheduling_prerequisites(handler))
    real.kubectl("create", "secret", "generic", tmpl.SECRET, f"--from-literal=token={tmpl.SECRET_VALUE}",
                 check=False)
    real.apply_job(name, tmp_path, template=tmpl.scheduling_template(handler, host_network),
                   command=["python", "-c", tmpl.REPORT_ENV], **{"faultTolerance.pendingTimeoutSeconds": 5})
    pods = eventually(lambda: len(p := real.pods(name)) == 2 and all(any(
        c.get("reason") == "SchedulingGated" for c in x["status"].get("conditions", [])) for x in p) and p, 300,
        "both pods gated")
    tmpl.assert_gated(pods)
    time.sleep(10)  # past pendingTimeoutSeconds: a gated pod waits for its gate, it is not unschedulable
    tmpl.assert_waiting_not_failed(real.status(name))
    tmpl.assert_gated(real.pods(name))
    for pod in pods:
        real.kubectl(*tmpl.ungate(pod["metadata"]["name"]))
    status = _finished(real, name, 900)
    assert status["phase"] == "Succeeded" and status.get("restarts", 0) == 0, json.dumps(status)
    pods = real.pods(name)
    logs = {p["metadata"]["name"]: real.kubectl("logs", p["metadata"]["name"]).stdout for p in pods}
    tmpl.assert_carries_the_scheduling_template(pods, logs, handler, host_network)
