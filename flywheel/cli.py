"""`flywheel run | launch | plan | crd`: the command line. Each subcommand imports only what it needs."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from flywheel import __version__

EXIT_BAD_INPUT = 2
PLAN_RDZV_PORT = 29400  # what `flywheel plan` shows; `flywheel run` picks a free port


def _run(args: argparse.Namespace) -> int:
    from flywheel.local.runner import RunOptions, run_job

    return run_job(RunOptions(job_file=args.job, out=args.out, faults=tuple(args.fault or ()),
                              checkpoint_dir=args.checkpoint_dir, progress=not args.no_progress,
                              metrics_port_base=args.metrics_port_base))


def _launch(args: argparse.Namespace) -> int:
    from flywheel.trainer.launch import main as launch_main

    return launch_main(args.command)


def _plan(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from flywheel.plan import Placement, describe_plan, plan_workers
    from flywheel.spec import SpecError, load_job

    console = Console()
    try:
        job = load_job(args.job)
    except SpecError as err:
        console.print(f"[red]{args.job}: {err}[/]", highlight=False)
        return EXIT_BAD_INPUT
    replicas = args.replicas or job.spec.replicas.desired
    endpoint = f"127.0.0.1:{PLAN_RDZV_PORT}"
    placement = Placement(replicas=replicas, rdzv_backend="c10d", rdzv_endpoint=endpoint, master_addr="127.0.0.1",
                          master_port=PLAN_RDZV_PORT, checkpoint_dir=args.checkpoint_dir or job.spec.checkpoint.dir,
                          launcher=("flywheel", "launch"), metrics_port_base=args.metrics_port_base)
    try:
        plans = plan_workers(job, placement)
    except ValueError as err:
        console.print(f"[red]{err}[/]", highlight=False)
        return EXIT_BAD_INPUT
    if args.output == "json":
        print(json.dumps(describe_plan(plans), indent=2))
        return 0
    table = Table(title=f"{job.name}: {replicas} workers x {job.spec.procs_per_replica} ranks")
    for column in ("index", "name", "ranks", "command", "rendezvous", "checkpoints", "metrics port"):
        table.add_column(column)
    for p in plans:
        table.add_row(str(p.index), p.name, f"{p.first_rank}-{p.last_rank}", " ".join(p.argv),
                      f"{p.env['PET_RDZV_BACKEND']} {p.env['PET_RDZV_ENDPOINT']} nnodes {p.env['PET_NNODES']}",
                      p.env["FLYWHEEL_CHECKPOINT_DIR"], p.env["FLYWHEEL_METRICS_PORT"])
    console.print(table)
    return 0


def _operator(args: argparse.Namespace) -> int:
    from flywheel.operator.main import run  # kopf and the kube client load only for this subcommand

    return run(args.args)


def _crd(args: argparse.Namespace) -> int:
    from flywheel import crd

    if args.stdout:
        sys.stdout.write(crd.render_crd())
    else:
        print(f"wrote {crd.write_crd(args.path)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flywheel", description="Elastic, fault-tolerant training.")
    parser.add_argument("--version", action="version", version=f"flywheel {__version__}")
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a TrainingJob on this machine")
    run.add_argument("job", help="TrainingJob YAML")
    run.add_argument("--out", help="output directory (default runs/<name>/)")
    run.add_argument("--fault", action="append", metavar="SPEC",
                     help="inject a fault: kill:rank=R:step=S, hang:rank=R:step=S, lose-worker:replica=I:step=S")
    run.add_argument("--checkpoint-dir", help="override spec.checkpoint.dir")
    run.add_argument("--no-progress", action="store_true", help="plain progress lines instead of a live bar")
    run.add_argument("--metrics-port-base", type=int, default=0, metavar="P",
                     help="worker i serves Prometheus metrics on P+i (default: none)")
    run.set_defaults(func=_run)

    launch = sub.add_parser("launch", help="run torch's elastic agent for one worker (configured by PET_* env)",
                            description="Run inside a worker: `flywheel launch [-- user command ...]`.")
    launch.add_argument("command", nargs=argparse.REMAINDER, help="user command after --; default: the trainer")
    launch.set_defaults(func=_launch)

    plan = sub.add_parser("plan", help="show the workers a job would start")
    plan.add_argument("job", help="TrainingJob YAML")
    plan.add_argument("-o", "--output", choices=("table", "json"), default="table")
    plan.add_argument("--replicas", type=int, help="workers to plan (default: spec.replicas target or max)")
    plan.add_argument("--checkpoint-dir", help="override spec.checkpoint.dir")
    plan.add_argument("--metrics-port-base", type=int, default=0, metavar="P")
    plan.set_defaults(func=_plan)

    operator = sub.add_parser("operator", add_help=False, help="run the Kubernetes operator (see --help)")
    operator.add_argument("args", nargs=argparse.REMAINDER, help="operator options; `flywheel operator --help`")
    operator.set_defaults(func=_operator)

    crd = sub.add_parser("crd", help="write the TrainingJob CRD generated from the schema")
    crd.add_argument("path", nargs="?", default="crds/trainingjobs.flywheel.dev.yaml")
    crd.add_argument("--stdout", action="store_true", help="print instead of writing a file")
    crd.set_defaults(func=_crd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["operator"]:  # every option, --help included, belongs to the operator's own parser
        return _operator(argparse.Namespace(args=argv[1:]))
    args = build_parser().parse_args(argv)
    if args.subcommand == "launch" and args.command[:1] == ["--"]:
        args.command = args.command[1:]
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
