"""Operator scale: TrainingJob created -> all its pods created, for one job (the baseline), a 64-replica job, and
500 small jobs created at once; and the operator's memory.

The test cluster runs without its kubelet here, so pods are created but never run: what is measured is the
operator's own path (watch event -> reconcile pass -> status write -> pod creates) against a real API server
emulator, with the real `flywheel operator` process and a real etcd (each job also gets its liveness watch).
Latency per job = from its create call returning to the watch event of its last pod. Peer: the 1-job latency of
the same run; ratio = p50 (and p99) per-job latency at 500 jobs / 1 job (goal <= 2); operator RSS goal <= 200 MB.
The burst's throughput (jobs/s) and the CPU seconds per job of the operator and of this process (the emulator)
say where the time goes: on 2 cores the burst is bound by their sum, so the last job waits for all before it.

    python -m bench.operator_scale            # 5 single jobs, 64 replicas, 500 jobs (~1 min)
    python -m bench.operator_scale --quick    # 3 single jobs, 16 replicas, 50 jobs
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from bench.common import RESULTS, percentile, write_result
from flywheel.crd import GROUP, PLURAL, VERSION

REPO = Path(__file__).resolve().parents[1]
CRD = REPO / "crds" / "trainingjobs.flywheel.dev.yaml"
JOB_LABEL = f"{GROUP}/job"
RATIO_GOAL, RSS_GOAL_MB = 2.0, 200.0


def job_doc(name: str, replicas: int) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingJob", "metadata": {"name": name},
            "spec": {"replicas": {"min": replicas, "max": replicas}, "procsPerReplica": 1,
                     "trainer": {"model": {"preset": "gpt-tiny"},
                                 "training": {"steps": 10, "globalBatch": replicas, "microBatch": 1}},
                     "checkpoint": {"dir": f"/ckpt/{name}"}}}


class PodClock:
    """Watches every pod and records when each job's pods were first seen (wall clock)."""

    def __init__(self, core: client.CoreV1Api):
        self.core, self.seen = core, {}  # job -> {pod name: first seen}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        version = core.list_namespaced_pod("default").metadata.resource_version
        self.thread = threading.Thread(target=self._run, args=(version,), daemon=True)
        self.thread.start()

    def _run(self, version: str) -> None:
        while not self.stop.is_set():
            try:
                for event in watch.Watch().stream(self.core.list_namespaced_pod, "default",
                                                  resource_version=version, timeout_seconds=5):
                    pod = event["object"]
                    version = pod.metadata.resource_version
                    job = (pod.metadata.labels or {}).get(JOB_LABEL)
                    if event["type"] == "ADDED" and job:
                        with self.lock:
                            self.seen.setdefault(job, {}).setdefault(pod.metadata.name, time.time())
            except Exception:  # noqa: BLE001 -- any dropped or broken stream: resume from the last version
                time.sleep(0.1)

    def all_seen(self, job: str, count: int) -> float | None:
        with self.lock:
            pods = self.seen.get(job, {})
            return max(pods.values()) if len(pods) >= count else None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


class Harness:
    def __init__(self, workdir: Path):
        from tests.k8s_emulator.fixtures import start_cluster
        from tests.operator.conftest import OperatorProcess

        self.cluster = start_cluster(workdir / "cluster", nodes=1, etcd=True, run_kubelet=False)
        kubectl = REPO / ".tools" / "bin" / "kubectl"
        subprocess.run([str(kubectl), "--kubeconfig", str(self.cluster.kubeconfig), "apply", "-f", str(CRD)],
                       check=True, capture_output=True)
        events = workdir / "events"
        events.mkdir()
        self.operator = OperatorProcess(self.cluster, events, workdir / "operator.log")
        self.operator.start()
        api = config.new_client_from_config(config_file=str(self.cluster.kubeconfig))
        api.rest_client.pool_manager.connection_pool_kw["maxsize"] = 32  # the 500-job burst runs 16 threads
        self.custom, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        self.clock = PodClock(self.core)

    def create(self, name: str, replicas: int) -> float:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, job_doc(name, replicas))
        return time.time()

    def latencies(self, created: dict[str, float], replicas: int, timeout: float) -> dict[str, float | None]:
        deadline = time.monotonic() + timeout
        out: dict[str, float | None] = {}
        while time.monotonic() < deadline and len(out) < len(created):
            for name, at in created.items():
                if name not in out and (seen := self.clock.all_seen(name, replicas)) is not None:
                    out[name] = seen - at
            time.sleep(0.05)
        return {name: out.get(name) for name in created}

    def close(self) -> None:
        self.clock.stop.set()
        self.operator.stop()
        self.cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--singles", type=int, default=5, help="single jobs for the baseline")
    parser.add_argument("--wide", type=int, default=64, help="replicas of the wide job")
    parser.add_argument("--many", type=int, default=500, help="jobs created at once")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="2 single jobs, 4 replicas, 10 jobs (CI)")
    parser.add_argument("--out", type=Path, default=RESULTS / "operator_scale.json")
    args = parser.parse_args()
    if args.quick:
        args.singles, args.wide, args.many = 3, 16, 50
    if args.smoke:
        args.singles, args.wide, args.many = 2, 4, 10
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="operator-scale-") as tmp:
        h = Harness(Path(tmp))
        try:
            pid = h.operator.proc.pid
            singles = []
            for i in range(args.singles):
                singles.append(h.latencies({f"one-{i}": h.create(f"one-{i}", 1)}, 1, 60)[f"one-{i}"])
                print(f"single job {i + 1}/{args.singles}: {singles[-1]}", flush=True)
            wide = h.latencies({"wide": h.create("wide", args.wide)}, args.wide, 120)["wide"]
            print(f"{args.wide}-replica job: {wide}", flush=True)
            idle_rss = rss_mb(pid)[0]
            samples: list[float] = []
            sampling = threading.Event()

            def sample() -> None:
                while not sampling.is_set():
                    samples.append(rss_mb(pid)[0])
                    time.sleep(0.5)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            burst_began, operator_cpu, bench_cpu = time.monotonic(), cpu_seconds(pid), time.process_time()
            with ThreadPoolExecutor(16) as pool:
                names = [f"many-{i}" for i in range(args.many)]
                created = dict(zip(names, pool.map(lambda n: h.create(n, 1), names)))
            submit_s = time.monotonic() - burst_began
            many = h.latencies(created, 1, 300)
            burst_s = time.monotonic() - burst_began
            # Where the burst's time went: the operator process, and this process (API emulator, watch, clients).
            operator_cpu, bench_cpu = cpu_seconds(pid) - operator_cpu, time.process_time() - bench_cpu
            time.sleep(5)  # steady state with every job present
            sampling.set()
            sampler.join()
            rss_now, rss_peak = rss_mb(pid)
        finally:
            h.close()
    ok_singles = [s for s in singles if s is not None]
    ok_many = [v for v in many.values() if v is not None]
    base = statistics.median(ok_singles) if ok_singles else float("nan")
    p50, p99 = percentile(ok_many, 0.5), percentile(ok_many, 0.99)
    ratio50, ratio99 = p50 / base, p99 / base
    peak = max(samples + [rss_peak])
    passed = bool(len(ok_many) == args.many and ratio50 <= RATIO_GOAL and peak <= RSS_GOAL_MB)
    write_result("operator_scale", path=args.out, metric=f"p50 per-job latency, {args.many} jobs at once / 1 job",
                 value=p50, unit="s", peer="1 job alone (median), same run", peer_value=base, ratio=ratio50,
                 goal=f"p50 ratio <= {RATIO_GOAL:g}, operator RSS <= {RSS_GOAL_MB:g} MB", passed=passed,
                 runs={"singles_s": singles, "wide": {"replicas": args.wide, "latency_s": wide},
                       "many": {"jobs": args.many, "created": len(created), "all_pods_seen": len(ok_many),
                                "p50_s": p50, "p99_s": p99, "max_s": max(ok_many, default=None),
                                "ratio_p50": ratio50, "ratio_p99": ratio99, "submit_s": submit_s,
                                "burst_s": burst_s, "jobs_per_second": len(ok_many) / burst_s,
                                "operator_cpu_s": operator_cpu, "emulator_and_bench_cpu_s": bench_cpu},
                       "rss_mb": {"idle_after_wide": idle_rss, "peak": peak, "after_burst": rss_now}},
                 quick=args.quick or args.smoke, load_average_1m=os.getloadavg()[0],
                 bench_seconds=time.monotonic() - began)
    print(f"1 job {base:.3f} s; {args.wide} replicas {wide} s; {args.many} jobs p50 {p50:.3f} s p99 {p99:.3f} s "
          f"(ratio p50 {ratio50:.2f}, p99 {ratio99:.2f}); {len(ok_many) / burst_s:.0f} jobs/s, operator CPU "
          f"{operator_cpu / max(len(ok_many), 1) * 1000:.1f} ms/job, emulator+bench CPU "
          f"{bench_cpu / max(len(ok_many), 1) * 1000:.1f} ms/job; RSS peak {peak:.0f} MB; "
          f"{'PASS' if passed else 'FAIL'} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
