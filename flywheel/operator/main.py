"""`flywheel operator`: run the TrainingJob operator (kopf) against a cluster. `run(argv)` is the entry point."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Sequence

from flywheel.monitor import MonitorSettings, add_monitor_arguments, settings_from_args
from flywheel.operator.config import OperatorConfig, QuietWakeups, tune_gc
from flywheel.operator.drain import DEFAULT_DRAIN_TAINT_KEYS
from flywheel.operator.manifests import OperatorSettings
from flywheel.spec.pod_merge import SECURITY_PROFILES

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flywheel operator", description="Reconcile TrainingJobs into worker pods.")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                   help="kubeconfig path (default $KUBECONFIG; none = in-cluster service account)")
    p.add_argument("--etcd-endpoints", default=os.environ.get("FLYWHEEL_ETCD_ENDPOINTS", ""), required=False,
                   help="host:port[,host:port]: the workers' etcd-v3 rendezvous and liveness keys")
    p.add_argument("-n", "--namespace", action="append", default=[], help="watch these namespaces (default: all)")
    p.add_argument("--events-dir", default=os.environ.get("FLYWHEEL_EVENTS_DIR", ""),
                   help="directory shared with the workers for their event logs (step/checkpoint/goodput in status)")
    p.add_argument("--events-claim", default="",
                   help="the PersistentVolumeClaim holding --events-dir: mounted there in every worker (it must exist "
                        "in each job's namespace)")
    p.add_argument("--metrics-port-base", type=int, default=9400, help="workers serve metrics here; 0 = none")
    p.add_argument("--worker-env", action="append", default=[], metavar="K=V", help="extra env for every worker")
    p.add_argument("--gang-scheduler", choices=("none", "scheduler-plugins", "volcano"), default="none",
                   help="create a PodGroup of this scheduler for jobs with scheduling.gang (its CRDs must exist)")
    p.add_argument("--security-profile", choices=SECURITY_PROFILES, default="hardened",
                   help="the workers' default security context: hardened (non-root UID 10001, read-only root with "
                        "writable /tmp and cache home, no capabilities) or image (the image's user, a writable root); "
                        "a job's spec.template securityContext overrides it field by field")
    p.add_argument("--rdma-resource", default="rdma/rdma_shared_device_a",
                   help="the device resource each worker of a `network: rdma` job requests (one), with IPC_LOCK")
    p.add_argument("--drain-taint-keys", default=",".join(DEFAULT_DRAIN_TAINT_KEYS), metavar="KEY,KEY",
                   help="drain ahead (docs/operator.md): a NoSchedule/NoExecute taint with one of these keys on a "
                        "worker's node moves the worker after a memory checkpoint, as a cordon does; '' = cordons "
                        "only (default: the keys of kubectl cordon, NVSentinel, AWS NTH, GKE, Karpenter and the "
                        "Cluster Autoscaler)")
    p.add_argument("--no-disruption-budgets", dest="disruption_budgets", action="store_false",
                   help="create no PodDisruptionBudget per job: an eviction (kubectl drain, a node upgrade) then takes "
                        "a worker at once instead of waiting for drain ahead to move it (docs/operator.md)")
    p.add_argument("--no-worker-liveness", dest="worker_liveness", action="store_false",
                   help="do not watch the workers' etcd lease keys: a dead worker is then seen only through pod and "
                        "node status, i.e. after the node monitor's grace period (bench/dead_worker.py's peer)")
    p.add_argument("--no-hang-detection", dest="hang_detection", action="store_false",
                   help="do not restart a job whose etcd progress shows no step for progressTimeoutSeconds "
                        "(firstStepTimeoutSeconds before the first step); works without Prometheus")
    p.add_argument("--operator-metrics-port", type=int, default=8080,
                   help="serve the operator's own Prometheus metrics here; 0 = off")
    p.add_argument("--liveness", default="", metavar="URL",
                   help="serve kopf's liveness endpoint here, e.g. http://0.0.0.0:8081/healthz (answered from the "
                        "operator's event loop once started, so a hung loop fails the probe); empty = none")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--api-port", type=int, default=0,
                   help="also serve the REST status API (docs/api.md) on this port; 0 = off (`flywheel api` alone)")
    p.add_argument("--api-host", default="0.0.0.0", help="address for --api-port (default 0.0.0.0)")
    p.add_argument("--api-token-file", default="",
                   help="static bearer tokens for the API instead of TokenReview/SubjectAccessReview")
    add_monitor_arguments(p)  # --prometheus-url, --no-health-monitor, --no-cordon, ... (docs/monitoring.md)
    return p


def drain_taint_keys(text: str) -> tuple[str, ...]:
    """--drain-taint-keys: comma-separated taint keys, blanks dropped."""
    return tuple(key.strip() for key in text.split(",") if key.strip())


def monitor_settings(args: argparse.Namespace) -> MonitorSettings | None:
    """The health monitor's settings, or None when it is turned off (or no Prometheus URL is given)."""
    if not args.health_monitor or not args.prometheus_url:
        return None
    return settings_from_args(args)


def run(argv: Sequence[str] | None = None, serve_api: Callable[[argparse.Namespace], None] | None = None) -> int:
    """`serve_api(args)` starts the REST API in this process when --api-port is set; the CLI passes it, since
    the operator does not import the API (they are siblings)."""
    args = build_parser().parse_args(argv)
    if not args.etcd_endpoints:
        print("flywheel operator: --etcd-endpoints (or FLYWHEEL_ETCD_ENDPOINTS) is required: cluster workers "
              "rendezvous through etcd v3")
        return 2
    if args.liveness and not args.liveness.startswith("http://"):
        print(f"flywheel operator: --liveness {args.liveness!r}: kopf serves only http://HOST:PORT/PATH")
        return 2
    try:
        monitor = monitor_settings(args)
    except ValueError as err:
        print(f"flywheel operator: {err}")
        return 2
    if args.api_port:
        if serve_api is None:
            print("flywheel operator: --api-port needs the `flywheel operator` command (or run `flywheel api`)")
            return 2
        serve_api(args)
    from flywheel.kube import lazy_packages

    lazy_packages.install()  # kopf imports kubernetes_asyncio's models when it is installed: only those it uses
    import kopf

    from flywheel.operator import handlers  # noqa: F401  (registers the kopf handlers)

    env = tuple((key, value) for key, _, value in (item.partition("=") for item in args.worker_env if "=" in item))
    settings = OperatorSettings(etcd_endpoints=args.etcd_endpoints, events_dir=args.events_dir,
                                events_claim=args.events_claim, metrics_port_base=args.metrics_port_base,
                                worker_env=env, gang_scheduler=args.gang_scheduler,
                                worker_liveness=args.worker_liveness, hang_detection=args.hang_detection,
                                security_profile=args.security_profile, rdma_resource=args.rdma_resource,
                                drain_taint_keys=drain_taint_keys(args.drain_taint_keys),
                                disruption_budgets=args.disruption_budgets)
    tune_gc()
    kopf.configure(verbose=args.verbose)
    if not args.verbose:  # httpx logs every Prometheus query of the health monitor at INFO
        logging.getLogger("httpx").setLevel(logging.WARNING)
        logging.getLogger("kopf.objects").addFilter(QuietWakeups())
    config = OperatorConfig(kubeconfig=args.kubeconfig, settings=settings,
                                     metrics_port=args.operator_metrics_port, monitor=monitor,
                                     namespaces=tuple(args.namespace))
    kopf.run(standalone=True, clusterwide=not args.namespace, namespaces=args.namespace,
             liveness_endpoint=args.liveness or None, memo=kopf.Memo(config=config))
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
