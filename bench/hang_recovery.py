"""Hang recovery: a rank is SIGSTOPped -> the hang is detected -> the first training step after the recovery.

The same script (examples/scripts/hang_probe.py: 2 ranks, gloo all_reduce per step, a 10 s gloo timeout; rank 1
SIGSTOPs itself once) runs
- ours: as a TrainingJob's `spec.command` (2 pods x 1 rank) on the test cluster, `flywheel operator` with the
  health monitor reading a real Prometheus that scrapes the ranks' `flywheel.progress` metrics every second;
  `progressTimeoutSeconds` 5. Detection is whichever the job's status shows first: its Hung condition (the health
  monitor), or the agents' restart of the ranks in place (the stopped rank's peer's collective times out, its agent
  restarts the group's ranks: `status.restarts` rises with `lastRestartReason` RankRestarted), or another failure
  the operator decided; `detected_by` names it. Recovery is the first training step after the hang, whichever
  restarted the ranks (the operator's restart of the job, or the agents in place).
- peer: `torchrun --max-restarts 3` (nnodes 1:2, c10d), where the hang is only seen when rank 0's gloo collective
  times out (10 s) and torchrun then restarts the group (after 30 s for the stopped rank to take SIGTERM). Two
  variants: defaults, where the restarted group often cannot connect (stale gloo addresses in the shared
  rendezvous store, pytorch#135712) and may not recover within the trial; and TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1,
  the known workaround, whose median is the peer value.
- ours without Prometheus (a row of its own): the same job, the operator as the chart starts it by default
  (etcd endpoints only, no Prometheus URL): hang detection from the ranks' etcd progress records. Every rank of
  both pods is SIGSTOPped from outside (so no collective ever times out: only the missing steps can tell); goal:
  the first step after <= progressTimeoutSeconds + 4 s.
Times are measured from the stopped rank's last step. Goals (the issue's): detect <= progressTimeoutSeconds + 10 s
(by whichever came first), resume <= detect + 5 s; the Prometheus trials run with the operator's etcd hang detection off
(`--no-hang-detection`), so that row measures the Prometheus path alone.

    python -m bench.hang_recovery            # 5 trials of ours, 3 without Prometheus, 2 of each torchrun
                                             # variant (~11 min)
    python -m bench.hang_recovery --quick    # 1 / 1 / 1 (the workaround variant only, nnodes 1, its gloo
                                             # timeout 3 s, beside ours; ~60 s)
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from bench.common import RESULTS, run_session, write_result
from flywheel.spec.crd.generate import GROUP, PLURAL, VERSION

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "examples" / "scripts" / "hang_probe.py"
CRD = REPO / "crds" / "trainingjobs.flywheel.dev.yaml"
PROGRESS_TIMEOUT_S = 5.0
GLOO_TIMEOUT_S = 10.0
QUICK_PEER_GLOO_TIMEOUT_S = 3.0  # bounds the peer's trial in quick runs (a faster peer, not a slower one)
SCRAPE_INTERVAL_S = 1.0
TRIAL_TIMEOUT_S = 150
ETCD_GOAL_MARGIN_S = 4.0  # without Prometheus: first step after <= progressTimeoutSeconds + this
STOP_ALL_AT_STEP = 20  # without Prometheus: every rank is stopped once rank 1 logged this step
HUNG, RANK_RESTARTED, NONE = "Hung", "RankRestarted", "none"  # what detected the hang (Trial.detected_by)


@dataclass(frozen=True)
class Trial:
    launcher: str
    detect_s: float | None  # stopped rank's last step -> hang detected
    resume_s: float | None  # stopped rank's last step -> first step after the recovery
    # "Hung" (the Hung condition), "RankRestarted" (the agents restarted the ranks in place), "failure (REASON)"
    # (another restart the operator decided), "gloo timeout" (torchrun), "none"
    detected_by: str

    @property
    def after_detect_s(self) -> float | None:
        return self.resume_s - self.detect_s if self.resume_s is not None and self.detect_s is not None else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _probe_times(log: Path) -> tuple[float | None, float | None, float | None]:
    """(stopped rank's last step, first gloo error, first step after the hang) from the probe's log."""
    last_stopped = error = first_after = None
    stop_rank = None
    for line in log.read_text().splitlines() if log.exists() else ():
        parts = line.split()
        if parts[0] == "stop":
            stop_rank = 1
        elif parts[0] == "error" and error is None:
            error = float(parts[2])
        elif parts[0] == "step":
            rank, when, attempt = int(parts[1]), float(parts[3]), int(parts[4])
            if attempt == 0 and stop_rank is None and rank == 1:
                last_stopped = when
            if attempt == 1 and first_after is None:
                first_after = when
    return last_stopped, error, first_after


def _is_zygote(pid: int) -> bool:
    """A worker's warm-start server (flywheel/agent/warm.py): spawned, or forked from the agent and renamed."""
    try:
        return (b"flywheel.agent.warm\0serve" in Path(f"/proc/{pid}/cmdline").read_bytes()
                or Path(f"/proc/{pid}/comm").read_text().strip() == "fw-zygote")
    except OSError:
        return False


def _probe_args(log: Path, marker: Path, gloo_timeout: float) -> list[str]:
    return [str(PROBE), str(log), str(marker), "--gloo-timeout", str(gloo_timeout)]


def torchrun_trial(index: int, workdir: Path, gloo_timeout: float, shared_store: bool, nnodes: str = "1:2") -> Trial:
    launcher = "torchrun" if shared_store else "torchrun-no-shared-store"
    log, marker = workdir / f"{launcher}-{index}.log", workdir / f"{launcher}-{index}.marker"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", nnodes, "--nproc-per-node", "2",
            "--max-restarts", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
            "--rdzv-id", f"hang-{index}-{os.getpid()}", *_probe_args(log, marker, gloo_timeout)]
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"}
    env["OMP_NUM_THREADS"] = "1"
    if not shared_store:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    run_session(argv, env, REPO, TRIAL_TIMEOUT_S)  # a timeout: the probe's log tells how far it got
    last, error, first_after = _probe_times(log)
    if last is None:
        return Trial(launcher, None, None, "none")
    return Trial(launcher, error - last if error else None, first_after - last if first_after else None,
                 "gloo timeout")


class OursHarness:
    """The test cluster (the real control plane), a real Prometheus scraping the two ranks' progress ports, and the
    operator."""

    def __init__(self, workdir: Path, gloo_timeout: float = GLOO_TIMEOUT_S):
        from tests.cluster.fixtures import start_cluster
        from tests.monitoring.prometheus_server import PrometheusServer, ScrapeJob
        from tests.operator.conftest import OperatorProcess

        self.workdir, self.gloo_timeout = workdir, gloo_timeout
        self.cluster = start_cluster(workdir / "cluster", nodes=2, etcd=True, heartbeat_seconds=0.5)
        self.cluster.add_claim("flywheel-events")  # --events-claim: the workers mount it
        port = _free_port()  # the process kubelet moves worker i to port + i (one host: see its host_ports.py)
        self.prometheus = PrometheusServer(workdir / "prometheus", [ScrapeJob(
            "ranks", [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"], honor_labels=True)])
        events = workdir / "events"
        events.mkdir()
        self.operator = OperatorProcess(self.cluster, events, workdir / "operator.log")
        self.operator.monitor_args = ["--prometheus-url", self.prometheus.url, "--health-interval", "0.25",
                                      "--scrape-interval", str(SCRAPE_INTERVAL_S), "--no-hang-detection"]
        self.etcd_only = False
        self.operator.extra_args = ["--metrics-port-base", str(port)]
        kubectl = REPO / ".tools" / "bin" / "kubectl"
        subprocess.run([str(kubectl), "--kubeconfig", str(self.cluster.kubeconfig), "apply", "-f", str(CRD)],
                       check=True, capture_output=True)
        self.cluster.wait_established("trainingjobs.flywheel.dev")
        self.operator.start()
        api = config.new_client_from_config(config_file=str(self.cluster.kubeconfig))
        self.custom, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)

    def without_prometheus(self) -> None:
        """The operator again as the chart starts it by default: no Prometheus URL, etcd hang detection on."""
        self.operator.stop()
        self.operator.monitor_args = ["--no-health-monitor"]
        self.operator.start()
        self.etcd_only = True

    def _stop_all_ranks(self, name: str, log: Path, marker: Path) -> None:
        """Once rank 1 logged STOP_ALL_AT_STEP, SIGSTOP every rank of both pods (the processes below each pod's
        agent; the agents run on and keep their liveness leases) and create the marker (the restarted ranks then
        log attempt 1)."""
        deadline = time.monotonic() + TRIAL_TIMEOUT_S
        while time.monotonic() < deadline:
            lines = log.read_text().splitlines() if log.exists() else []
            if any(p[:2] == ["step", "1"] and int(p[2]) >= STOP_ALL_AT_STEP for p in map(str.split, lines)):
                break
            time.sleep(0.05)
        else:
            return
        from flywheel.local import procs

        assert self.cluster.kubelet is not None
        marker.touch()
        pods: Any = self.core.list_namespaced_pod("default", label_selector=f"{GROUP}/job={name}")
        for pod in pods.items:
            agent = self.cluster.kubelet.pid_of("default", pod.metadata.name)
            for pid in procs.descendants(agent) if agent else []:
                if not _is_zygote(pid):  # the ranks hang, not the worker's warm-start server
                    os.kill(pid, signal.SIGSTOP)

    def trial(self, index: int) -> Trial:
        name = f"hang-{'etcd-' if self.etcd_only else ''}{index}"
        # The probe's log and marker live in the job's checkpoint dir: under the workers' read-only root
        # filesystem and non-root user, a volume is the only place they may write (its emptyDir is world-writable).
        ckpt = self.workdir / "ckpt" / name
        log, marker = ckpt / "probe.log", ckpt / "probe.marker"
        command = _probe_args(log, marker, self.gloo_timeout)
        if self.etcd_only:  # no rank stops itself: the bench stops them all
            command += ["--stop-step", "1000000000"]
            threading.Thread(target=self._stop_all_ranks, args=(name, log, marker), daemon=True).start()
        doc = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingJob", "metadata": {"name": name},
               "spec": {"replicas": {"min": 2, "max": 2}, "procsPerReplica": 1,
                        "command": command,
                        "checkpoint": {"dir": str(ckpt), "ephemeral": True},
                        "faultTolerance": {"maxRestarts": 3, "restartScope": "job",
                                           "progressTimeoutSeconds": PROGRESS_TIMEOUT_S}}}
        self.custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, yaml.safe_load(yaml.dump(doc)))
        detected_at, detected_by = None, NONE
        deadline = time.monotonic() + TRIAL_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                job: Any = self.custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
                status = job.get("status") or {}
                if detected_at is None and (seen := detection(status)) is not None:
                    detected_at, detected_by = time.time(), seen
                if status.get("phase") in ("Succeeded", "Failed"):
                    break
                time.sleep(0.05)
        finally:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
        last, _, first_after = _probe_times(log)
        launcher = "flywheel-etcd" if self.etcd_only else "flywheel"
        if last is None:
            return Trial(launcher, None, None, detected_by)
        return Trial(launcher, detected_at - last if detected_at else None,
                     first_after - last if first_after else None, detected_by)

    def close(self) -> None:
        self.operator.stop()
        self.prometheus.stop()
        self.cluster.stop()


def detection(status: dict[str, Any]) -> str | None:
    """What the job's status shows of the hang first (Trial.detected_by), or None while it shows nothing."""
    if any(c["type"] == "Hung" and c["status"] == "True" for c in status.get("conditions", [])):
        return HUNG
    if status.get("restarts", 0) < 1:
        return None
    reason = status.get("lastRestartReason")
    return reason if reason in (HUNG, RANK_RESTARTED) else f"failure ({reason})"


def _stats(trials: list[Trial]) -> dict[str, float | int | None]:
    def med(values: list[float | None]) -> float | None:
        got = [v for v in values if v is not None]
        return statistics.median(got) if got else None

    return {"trials": len(trials), "recovered": sum(t.resume_s is not None for t in trials),
            "detect_median_s": med([t.detect_s for t in trials]), "resume_median_s": med([t.resume_s for t in trials]),
            "after_detect_median_s": med([t.after_detect_s for t in trials]),
            "resume_max_s": max((t.resume_s for t in trials if t.resume_s is not None), default=None)}


def etcd_row(trials: list[Trial]) -> dict[str, Any]:
    """The report row of the trials without Prometheus: first step after the hang against its goal."""
    stats, goal = _stats(trials), PROGRESS_TIMEOUT_S + ETCD_GOAL_MARGIN_S
    resume = stats["resume_median_s"]
    passed = bool(resume is not None and stats["recovered"] == stats["trials"] and resume <= goal
                  and all(t.detected_by == HUNG for t in trials))
    return {"name": "no Prometheus", "metric": "hang, operator with etcd only (chart defaults), every rank "
                                               "SIGSTOPped: last step -> first step after recovery, median",
            "value": resume, "unit": "s", "peer": "goal", "peer_value": goal,
            "ratio": resume / goal if resume is not None else None,
            "goal": f"<= progressTimeoutSeconds ({PROGRESS_TIMEOUT_S:g} s) + {ETCD_GOAL_MARGIN_S:g} s, "
                    "detected as Hung", "pass": passed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--etcd-trials", type=int, default=3,
                        help="trials of ours without Prometheus (every rank stopped; etcd progress detects)")
    parser.add_argument("--peer-trials", type=int, default=2, help="trials of each torchrun variant")
    parser.add_argument("--quick", action="store_true",
                        help="1 trial of ours, 1 without Prometheus and 1 of torchrun without the shared store, fixed "
                             "size, the peer's gloo timeout 3 s, run beside ours (~60 s)")
    parser.add_argument("--peer-nnodes", default="1:2",
                        help="torchrun's --nnodes (quick: 1, which skips the 30 s last-call wait of a re-forming "
                             "elastic group: a faster peer than the default)")
    parser.add_argument("--no-default-peer", action="store_true",
                        help="skip torchrun with defaults (CI smoke: it may not recover within the trial)")
    parser.add_argument("--peer-gloo-timeout", type=float, default=GLOO_TIMEOUT_S,
                        help="the probe's collective timeout under torchrun (CI smoke: shorter, to bound its trial)")
    parser.add_argument("--out", type=Path, default=RESULTS / "hang_recovery.json")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.etcd_trials, args.peer_trials, args.no_default_peer, args.peer_nnodes = 1, 1, 1, True, "1"
        args.peer_gloo_timeout = min(args.peer_gloo_timeout, QUICK_PEER_GLOO_TIMEOUT_S)
    started = time.monotonic()
    ours: list[Trial] = []
    etcd_only: list[Trial] = []
    peers: dict[str, list[Trial]] = {"torchrun-no-shared-store": []}
    if not args.no_default_peer:
        peers["torchrun"] = []
    with tempfile.TemporaryDirectory(prefix="hang-recovery-") as tmp:
        def run_peers() -> None:
            for launcher, runs in peers.items():
                for i in range(args.peer_trials):
                    runs.append(torchrun_trial(i, Path(tmp), args.peer_gloo_timeout, launcher == "torchrun",
                                               args.peer_nnodes))
                    print(f"{launcher} trial {i + 1}/{args.peer_trials}: {runs[-1]}", flush=True)

        # Quick: the peer's trial (mostly its timeouts) runs beside ours instead of after it; both then share the
        # cores, which a quick run does not judge.
        beside = threading.Thread(target=run_peers) if args.quick else None
        if beside:
            beside.start()
        harness = OursHarness(Path(tmp) / "ours")
        try:
            for i in range(args.trials):
                ours.append(harness.trial(i))
                print(f"flywheel trial {i + 1}/{args.trials}: {ours[-1]}", flush=True)
            harness.without_prometheus()
            for i in range(args.etcd_trials):
                etcd_only.append(harness.trial(i))
                print(f"flywheel without Prometheus, trial {i + 1}/{args.etcd_trials}: {etcd_only[-1]}", flush=True)
        finally:
            harness.close()
        if beside:
            beside.join()
        else:
            run_peers()
    head = _stats(ours)
    peer_stats = {launcher: _stats(runs) for launcher, runs in peers.items()}
    peer = peer_stats["torchrun-no-shared-store"]
    detect, resume, after = head["detect_median_s"], head["resume_median_s"], head["after_detect_median_s"]
    passed = bool(detect is not None and after is not None and head["recovered"] == head["trials"]
                  and detect <= PROGRESS_TIMEOUT_S + 10 and after <= 5
                  and all(t.detected_by != NONE for t in ours))
    write_result("hang_recovery", path=args.out,
                 metric="hang: stopped rank's last step -> first step after recovery, median",
                 value=resume, unit="s",
                 peer=f"torchrun --nnodes {args.peer_nnodes} --max-restarts 3, {args.peer_gloo_timeout:g} s gloo "
                      "timeout, same script, "
                      "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (with defaults see stats.torchrun)",
                 peer_value=peer["resume_median_s"],
                 goal=f"detect <= progressTimeoutSeconds ({PROGRESS_TIMEOUT_S:g} s) + 10 s by whichever came first "
                      "(the Hung condition, or the agents' rank restart in place); resume <= detect + 5 s (medians)",
                 passed=passed, stats={"flywheel": head, "flywheel-etcd": _stats(etcd_only), **peer_stats},
                 rows=[etcd_row(etcd_only)],
                 runs={"flywheel": [{**asdict(t), "after_detect_s": t.after_detect_s} for t in ours],
                       "flywheel-etcd": [{**asdict(t), "after_detect_s": t.after_detect_s} for t in etcd_only],
                       **{launcher: [asdict(t) for t in runs] for launcher, runs in peers.items()}},
                 progress_timeout_seconds=PROGRESS_TIMEOUT_S, gloo_timeout_seconds=GLOO_TIMEOUT_S,
                 peer_gloo_timeout_seconds=args.peer_gloo_timeout, peer_nnodes=args.peer_nnodes, quick=args.quick,
                 scrape_interval_seconds=SCRAPE_INTERVAL_S, load_average_1m=os.getloadavg()[0],
                 bench_seconds=time.monotonic() - started)
    print(f"ours: detect {detect} s, resume {resume} s ({after} s after detection); " + "; ".join(
        f"{launcher}: detect {st['detect_median_s']} s, resume {st['resume_median_s']} s, recovered "
        f"{st['recovered']}/{st['trials']}" for launcher, st in peer_stats.items())
        + f"; {'PASS' if passed else 'FAIL'} -> {args.out}")
    row = etcd_row(etcd_only)
    print(f"ours without Prometheus: first step after {row['value']} s (goal <= {row['peer_value']:g} s): "
          f"{'PASS' if row['pass'] else 'FAIL'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
