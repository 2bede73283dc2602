"""`flywheel operator`: run the TrainingJob operator (kopf) against a cluster. `run(argv)` is the entry point."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from flywheel.operator.manifests import OperatorSettings


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flywheel operator", description="Reconcile TrainingJobs into worker pods.")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                   help="kubeconfig path (default $KUBECONFIG; none = in-cluster service account)")
    p.add_argument("--etcd-endpoints", default=os.environ.get("FLYWHEEL_ETCD_ENDPOINTS", ""), required=False,
                   help="host:port[,host:port]: the workers' etcd-v3 rendezvous and liveness keys")
    p.add_argument("-n", "--namespace", action="append", default=[], help="watch these namespaces (default: all)")
    p.add_argument("--events-dir", default=os.environ.get("FLYWHEEL_EVENTS_DIR", ""),
                   help="directory shared with the workers for their event logs (step/checkpoint/goodput in status)")
    p.add_argument("--metrics-port-base", type=int, default=9400, help="workers serve metrics here; 0 = none")
    p.add_argument("--host-network-ports", action="store_true",
                   help="all pods share one host (test cluster): worker i uses metrics port base + i")
    p.add_argument("--worker-env", action="append", default=[], metavar="K=V", help="extra env for every worker")
    p.add_argument("--workdir", default="", help="test cluster only: working directory annotation for workers")
    p.add_argument("--gang-scheduler", choices=("none", "scheduler-plugins", "volcano"), default="none",
                   help="create a PodGroup of this scheduler for jobs with scheduling.gang (its CRDs must exist)")
    p.add_argument("--operator-metrics-port", type=int, default=8080,
                   help="serve the operator's own Prometheus metrics here; 0 = off")
    p.add_argument("--verbose", action="store_true")
    return p


def run(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.etcd_endpoints:
        print("flywheel operator: --etcd-endpoints (or FLYWHEEL_ETCD_ENDPOINTS) is required: cluster workers "
              "rendezvous through etcd v3")
        return 2
    import kopf

    from flywheel.operator import handlers

    env = tuple(tuple(item.split("=", 1)) for item in args.worker_env if "=" in item)
    settings = OperatorSettings(etcd_endpoints=args.etcd_endpoints, events_dir=args.events_dir,
                                metrics_port_base=args.metrics_port_base, host_network_ports=args.host_network_ports,
                                worker_env=env, workdir_annotation=args.workdir,
                                gang_scheduler=args.gang_scheduler)  # type: ignore[arg-type]
    kopf.configure(verbose=args.verbose)
    config = handlers.OperatorConfig(kubeconfig=args.kubeconfig, settings=settings,
                                     metrics_port=args.operator_metrics_port)
    kopf.run(standalone=True, clusterwide=not args.namespace, namespaces=args.namespace,
             memo=kopf.Memo(config=config))
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
