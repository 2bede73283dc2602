"""The project's image, built from the Dockerfile (scripts/image/test-image.sh: `make image`'s build, kept under a key
of the Dockerfile, pyproject.toml and constraints.txt, with the checkout's package copied in) and run by podman as
Kubernetes runs it: `--help` as uid 10001 on a read-only root; the operator and the REST API started against the
test cluster's real API server until their probes answer; and a 2-worker job as two containers made from the pods
`flywheel render` prints (the same command, env, user, read-only root, the pod's writable volumes, every capability
dropped, no new privileges, the host network), once undisturbed and once with a worker's container killed and
created again as the operator recreates a lost pod, ending with bitwise equal parameters. Skipped only where podman
cannot run at all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.etcd_process import EtcdServer, free_port
from tests.image.build import ENV, project_image

REPO = Path(__file__).resolve().parents[2]
KUBECTL = REPO / ".tools" / "bin" / "kubectl"
CRD = REPO / "crds" / "trainingjobs.flywheel.dev.yaml"
USER = "10001:10001"
# What a hardened pod's container gets from the runtime, whatever it runs (flywheel render's securityContext).
HARDENED = ["--read-only", "--read-only-tmpfs=false", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--network", "host"]

# A cold build (no image under the current key) takes minutes; a warm one copies the package (seconds).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=ENV)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {result.returncode}\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-3000:]}")
    return result


@pytest.fixture(scope="module")
def image() -> str:
    return project_image()


def test_help_runs_as_uid_10001_on_a_read_only_root(image: str) -> None:
    result = podman("run", "--rm", "--read-only", "--user", "10001", "--network", "none", image, "--help")
    for command in ("run", "launch", "operator", "api", "render"):
        assert command in result.stdout
    # The default user and entrypoint, as a pod without securityContext gets them.
    config = json.loads(podman("image", "inspect", image).stdout)[0]["Config"]
    assert config["User"] == USER and config["Entrypoint"] == ["flywheel"]


def test_runtime_stage_is_lean(image: str) -> None:
    """No compiler, no pip cache, no test extras in the image the pods run."""
    script = ("import os, shutil; from importlib.util import find_spec;"
              "print(sorted(n for n in ('gcc', 'cc', 'g++', 'make') if shutil.which(n)));"
              "print(sorted(m for m in ('pytest', 'hypothesis', 'moto', 'ruff', 'mypy') if find_spec(m)));"
              "print(sorted(p for p in ('/root/.cache/pip', '/home/flywheel/.cache', '/src') if os.path.exists(p)))")
    out = podman("run", "--rm", "--network", "none", "--user", "0", "--entrypoint", "python", image, "-c",
                 script).stdout
    assert out.split("\n")[:3] == ["[]", "[]", "[]"], out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, image: str) -> Iterator[Any]:
    """The test cluster's control plane (no nodes: nothing is scheduled) with the TrainingJob CRD."""
    if not KUBECTL.exists():
        pytest.skip("real kubectl missing: run scripts/install-tools.sh")
    from tests.cluster.fixtures import start_cluster

    running = start_cluster(tmp_path_factory.mktemp("cluster"), nodes=0, etcd=True)
    try:
        subprocess.run([str(KUBECTL), "--kubeconfig", str(running.kubeconfig), "apply", "-f", str(CRD)],
                       check=True, capture_output=True, timeout=60)
        running.wait_established("trainingjobs.flywheel.dev")
        yield running
    finally:
        running.stop()


def container_kubeconfig(cluster: Any, folder: Path) -> Path:
    """The cluster's kubeconfig and CA readable by uid 10001, the CA at the path the container sees."""
    folder.mkdir(mode=0o755)
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    ca = Path(config["clusters"][0]["cluster"]["certificate-authority"])
    shutil.copy(ca, folder / "ca.crt")
    config["clusters"][0]["cluster"]["certificate-authority"] = "/kube/ca.crt"
    (folder / "config").write_text(yaml.safe_dump(config))
    for path in (folder / "ca.crt", folder / "config"):
        path.chmod(0o644)
    return folder


def wait_http(url: str, timeout: float, container: str) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return int(reply.status)
        except OSError:
            pass
        state = podman("inspect", "--format", "{{.State.Status}}", container, check=False).stdout.strip()
        if state not in ("running", "created", "configured"):
            break
        time.sleep(0.5)
    logs = podman("logs", container, check=False)
    raise AssertionError(f"{url} did not answer (container {state})\n{logs.stdout[-3000:]}\n{logs.stderr[-3000:]}")


def test_operator_and_api_start_and_answer_their_probes(image: str, cluster: Any, tmp_path: Path) -> None:
    """As the chart runs them: uid 10001, read-only root, no capabilities. The operator's argument checks refuse a
    missing etcd; started against the real API server, kopf's liveness endpoint (the chart's probes) and the API's
    /healthz and /readyz (the cache synced from the API server) answer."""
    refused = podman("run", "--rm", "--user", USER, *HARDENED, image, "operator", check=False)
    assert refused.returncode == 2 and "--etcd-endpoints" in refused.stdout, refused
    kube = container_kubeconfig(cluster, tmp_path / "kube")
    mounts = ["--volume", f"{kube}:/kube:ro", "--tmpfs", "/tmp:mode=1777"]
    liveness, metrics, api_port = free_port(), free_port(), free_port()
    etcd = cluster.etcd_url.removeprefix("http://")
    names = {"operator": f"fw-operator-{os.getpid()}", "api": f"fw-api-{os.getpid()}"}
    try:
        podman("run", "-d", "--name", names["operator"], "--user", USER, *HARDENED, *mounts, image, "operator",
               "--kubeconfig", "/kube/config", "--etcd-endpoints", etcd, "-n", "default",
               "--liveness", f"http://127.0.0.1:{liveness}/healthz", "--operator-metrics-port", str(metrics))
        podman("run", "-d", "--name", names["api"], "--user", USER, *HARDENED, *mounts, image, "api",
               "--kubeconfig", "/kube/config", "--host", "127.0.0.1", "--port", str(api_port), "-n", "default")
        assert wait_http(f"http://127.0.0.1:{liveness}/healthz", 90, names["operator"]) == 200
        assert wait_http(f"http://127.0.0.1:{metrics}/metrics", 30, names["operator"]) == 200
        assert wait_http(f"http://127.0.0.1:{api_port}/healthz", 60, names["api"]) == 200
        assert wait_http(f"http://127.0.0.1:{api_port}/readyz", 60, names["api"]) == 200
    finally:
        for name in names.values():
            podman("rm", "--force", "--time", "5", name, check=False)


# The two-worker job: operator-tiny's spec, long enough (~30 ms a step) to be killed in the middle.
STEPS = 300
KILL_AFTER = 50
JOB = {
    "apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "img-tiny"},
    "spec": {
        "image": "flywheel:latest", "replicas": {"min": 2, "max": 2}, "procsPerReplica": 1,
        "trainer": {"model": {"preset": "gpt-tiny"}, "parallelism": {"fsdp": False},
                    "training": {"steps": STEPS, "globalBatch": 8, "microBatch": 2, "lr": 3e-3, "warmupSteps": 3,
                                 "seed": 0},
                    "data": {"source": "synthetic"}},
        "checkpoint": {"dir": "/ckpt/img-tiny", "claimName": "ckpt", "everySteps": 10, "keep": 2, "async": True},
        "faultTolerance": {"maxRestarts": 3, "progressTimeoutSeconds": 30, "firstStepTimeoutSeconds": 120,
                           "restartScope": "job"},
    },
}


def render_pods(tmp: Path, image: str, etcd: str, uid: str) -> list[dict[str, Any]]:
    """The worker pods as the operator creates them (`flywheel render`, the image's), with an events claim."""
    job = tmp / "job.yaml"
    job.write_text(yaml.safe_dump(JOB))
    job.chmod(0o644)
    out = podman("run", "--rm", "--network", "none", "--read-only", "--volume", f"{job}:/job.yaml:ro", image,
                 "render", "/job.yaml", "-o", "json", "--uid", uid, "--etcd-endpoints", etcd,
                 "--metrics-port-base", "0", "--events-dir", "/events", "--events-claim", "events").stdout
    return [item for item in json.loads(out)["items"] if item["kind"] == "Pod"]


class Claims:
    """Host folders standing in for the job's PersistentVolumeClaims, world-writable as a fresh volume is."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def folder(self, claim: str, sub_path: str = "") -> Path:
        path = self.root / claim / sub_path
        path.mkdir(parents=True, exist_ok=True)
        for part in [self.root / claim, *(self.root / claim / p for p in Path(sub_path).parents if str(p) != ".")]:
            part.chmod(0o777)
        path.chmod(0o777)
        return path


def run_args(pod: dict[str, Any], claims: Claims, name: str, termination: Path) -> list[str]:
    """`podman run` arguments that give the container what the pod spec gives it on a node with host network."""
    spec = pod["spec"]
    container = spec["containers"][0]
    pod_ctx, ctx = spec.get("securityContext", {}), container.get("securityContext", {})
    uid = ctx.get("runAsUser", pod_ctx.get("runAsUser"))
    gid = ctx.get("runAsGroup", pod_ctx.get("runAsGroup"))
    assert uid == 10001 and gid == 10001 and pod_ctx.get("runAsNonRoot") is True, pod_ctx
    assert ctx.get("readOnlyRootFilesystem") is True and ctx.get("allowPrivilegeEscalation") is False, ctx
    assert ctx.get("capabilities", {}).get("drop") == ["ALL"] and not ctx["capabilities"].get("add"), ctx
    args = ["--name", name, "--hostname", spec["hostname"], "--user", f"{uid}:{gid}", *HARDENED]
    # What the cluster's DNS answers for the job's headless Service on the host network: this node.
    domain = f"{spec['subdomain']}.{pod['metadata']['namespace']}.svc"
    for index in range(2):
        host = f"{pod['metadata']['labels']['flywheel.dev/job']}-worker-{index}"
        args += ["--add-host", f"{host}:127.0.0.1", "--add-host", f"{host}.{domain}:127.0.0.1"]
    if "fsGroup" in pod_ctx:
        args += ["--group-add", str(pod_ctx["fsGroup"])]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in container["volumeMounts"]:
        volume, target = volumes[mount["name"]], mount["mountPath"]
        if volume.get("emptyDir", {}).get("medium") == "Memory":
            size = volume["emptyDir"].get("sizeLimit")
            options = "mode=1777,notmpcopyup" + (f",size={size.removesuffix('i').lower()}" if size else "")
            args += ["--tmpfs", f"{target}:{options}"]
        elif "emptyDir" in volume:  # a kubelet's: an empty folder on the node's disk, mode 0777
            folder = claims.folder(f"emptydir-{name}-{volume['name']}")
            args += ["--volume", f"{folder}:{target}"]
        else:
            claim = volume["persistentVolumeClaim"]["claimName"]
            args += ["--volume", f"{claims.folder(claim, mount.get('subPath', ''))}:{target}"]
    termination.touch()
    termination.chmod(0o666)
    args += ["--volume", f"{termination}:{container['terminationMessagePath']}"]
    for item in container["env"]:
        assert "value" in item, f"env {item['name']} from a source this test does not emulate"
        args += ["--env", f"{item['name']}={item['value']}"]
    command = container["command"]
    return [*args, "--entrypoint", command[0], pod["spec"]["containers"][0]["image"], *command[1:]]


def read_events(folder: Path) -> list[dict[str, Any]]:
    events = []
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                pass  # a line being written
    return events


class Job:
    """One run of the job's worker pods as containers."""

    def __init__(self, tmp: Path, image: str, etcd: str, label: str, run: int) -> None:
        """`run` makes the job's uid, and so its rendezvous id (the uid's first 8 characters), its own on the
        shared etcd: a finished run closes its rendezvous."""
        self.tmp, self.image, self.label = tmp, image, label
        tmp.mkdir(parents=True)
        self.pods = render_pods(tmp, image, etcd, uid=f"{run:08d}-0000-0000-0000-000000000000")
        assert len(self.pods) == 2
        self.claims = Claims(tmp / "claims")
        self.events = self.claims.folder("events")
        self.started: dict[str, float] = {}
        self.names: list[str] = []

    def name(self, index: int, attempt: int = 0) -> str:
        return f"fw-{self.label}-{os.getpid()}-w{index}-{attempt}"

    def start(self, index: int, attempt: int = 0) -> str:
        name = self.name(index, attempt)
        args = run_args(self.pods[index], self.claims, name, self.tmp / f"termination-{index}-{attempt}")
        args[args.index("--entrypoint") + 2] = self.image  # the image under test, whatever spec.image says
        self.started[name] = time.time()
        podman("run", "-d", *args)
        self.names.append(name)
        return name

    def steps(self) -> list[dict[str, Any]]:
        return [e for e in read_events(self.events) if e.get("event") == "step"]

    def wait_step(self, step: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(e["step"] >= step for e in self.steps()):
                return
            time.sleep(0.2)
        raise AssertionError(f"no step {step} in {timeout} s\n{self.logs()}")

    def wait_exit(self, name: str, timeout: float) -> int:
        result = podman("wait", name, timeout=timeout)
        return int(result.stdout.strip().splitlines()[-1])

    def logs(self) -> str:
        parts = []
        for name in self.names:
            out = podman("logs", name, check=False)
            parts.append(f"--- {name}\n{out.stdout[-2500:]}\n{out.stderr[-2500:]}")
        return "\n".join(parts)

    def done(self) -> list[dict[str, Any]]:
        return [e for e in read_events(self.events) if e.get("event") == "done"]

    def remove(self) -> None:
        for name in self.names:
            podman("rm", "--force", "--time", "2", name, check=False)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd") / "data")
    server.start()
    try:
        yield server.endpoint
    finally:
        server.stop()


def test_two_hardened_worker_containers_recover_a_lost_worker_bitwise(image: str, etcd: str, tmp_path: Path) -> None:
    reference = Job(tmp_path / "reference", image, etcd, "ref", 1)
    try:
        names = [reference.start(0), reference.start(1)]
        for name in names:
            assert reference.wait_exit(name, timeout=300) == 0, reference.logs()
        first_step = min(e["time"] for e in reference.steps())
        start_to_first_step = first_step - min(reference.started.values())
        done = reference.done()
        assert done and done[0]["params_sha256"] and done[0]["step"] == STEPS, (done, reference.logs())
    finally:
        reference.remove()
    print(f"container start to first step: {start_to_first_step:.1f} s")
    assert start_to_first_step < 120

    faulty = Job(tmp_path / "faulty", image, etcd, "kill", 2)
    try:
        survivor = faulty.start(0)
        faulty.start(1)
        faulty.wait_step(KILL_AFTER + 1, timeout=180)  # past a checkpoint
        killed_at = max(e["step"] for e in faulty.steps())
        podman("kill", "--signal", "KILL", faulty.name(1))
        killed = time.time()
        # The operator's answer to a lost pod: the same worker's pod created again.
        replacement = faulty.start(1, attempt=1)
        assert faulty.wait_exit(survivor, timeout=300) == 0, faulty.logs()
        assert faulty.wait_exit(replacement, timeout=120) == 0, faulty.logs()
        done = faulty.done()
        assert done and done[-1]["step"] == STEPS, (done, faulty.logs())
        steps = [e["step"] for e in faulty.steps()]
        assert killed_at < STEPS and len(steps) > len(set(steps)), f"no step replayed after the kill: {steps}"
        after = [e for e in faulty.steps() if e["time"] > killed]
        print(f"killed worker 1 at step {killed_at}; the job went on at step {after[0]['step']} "
              f"{after[0]['time'] - killed:.1f} s later (the replacement container's start included)")
        assert {e["params_sha256"] for e in done} == {reference.done()[0]["params_sha256"]}, (done, faulty.logs())
    finally:
        faulty.remove()
