"""`flywheel run | launch | plan | render | export | prepare-data | generate | crd | operator | api | status`: the
command line. Each subcommand imports only what it needs."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from flywheel import __version__

if TYPE_CHECKING:
    from rich.table import Table

    from flywheel.planner import PlanResult
    from flywheel.spec import TrainingJobSpec

EXIT_BAD_INPUT = 2
PLAN_RDZV_PORT = 29400  # what `flywheel plan` shows; `flywheel run` picks a free port


def _run(args: argparse.Namespace) -> int:
    from flywheel.local.runner import RunOptions, run_job

    options = RunOptions(job_file=args.job, out=args.out, faults=tuple(args.fault or ()),
                         checkpoint_dir=args.checkpoint_dir, progress=not args.no_progress,
                         metrics_port_base=args.metrics_port_base, spares=args.spares)
    if not args.api_port:
        return run_job(options)
    stop = _serve_local_api(args)
    try:
        return run_job(options)
    finally:
        stop()


def _serve_local_api(args: argparse.Namespace) -> Callable[[], None]:
    """Serve the local job read-only on 127.0.0.1 with the cluster API's schema (docs/api.md)."""
    from pathlib import Path

    from flywheel.api.app import create_app
    from flywheel.api.auth import TokenFileAuth
    from flywheel.api.localrun import EventLogSource
    from flywheel.api.server import ThreadedServer, local_token_files
    from flywheel.spec import SpecError, load_job

    try:
        job = load_job(args.job)
    except SpecError:
        return lambda: None  # run_job reports the bad spec
    out = Path(args.out or Path("runs") / job.name).resolve()  # where run_job writes events.jsonl
    raw, table = (None, Path(args.api_token_file)) if args.api_token_file else local_token_files(out)
    app = create_app(EventLogSource(job, out / "events.jsonl"), TokenFileAuth.from_file(table))
    server = ThreadedServer(app, "127.0.0.1", args.api_port)
    server.start()
    where = f"token in {raw}" if raw else f"tokens from {table}"
    print(f"API: http://127.0.0.1:{args.api_port}/v1/jobs/local/{job.name} ({where})", flush=True)
    return server.stop


def _launch(args: argparse.Namespace) -> int:
    from flywheel.agent.launch import main as launch_main

    return launch_main(args.command)


def _plan(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from flywheel.spec import SpecError, load_job
    from flywheel.spec.storage import storage_problem
    from flywheel.worker_plan import Placement, describe_plan, plan_workers

    console = Console(width=None if sys.stdout.isatty() else 160)  # tables stay readable when piped
    try:
        job = load_job(args.job)
    except SpecError as err:
        console.print(f"[red]{args.job}: {err}[/]", highlight=False)
        return EXIT_BAD_INPUT
    store_problem = storage_problem(args.checkpoint_dir or job.spec.checkpoint.dir)
    if store_problem:  # an object-store dir whose scheme or library this machine lacks
        console.print(f"[red]{args.job}: {store_problem}[/]", highlight=False)
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
    try:
        layout = _plan_layout(job.spec, replicas, args)
    except ValueError as err:  # PlanError, DeviceTableError, a bad --devices file
        console.print(f"[red]{err}[/]", highlight=False)
        return EXIT_BAD_INPUT
    if args.output == "json":
        # `chosen` and `candidates` at the top (the shape); `layout` keeps them with the search's context.
        summary = layout.to_json(args.top) if layout else None
        print(json.dumps({"workers": describe_plan(plans), "chosen": summary and summary["chosen"],
                          "candidates": summary["candidates"] if summary else [], "layout": summary}, indent=2))
        return 0
    table = Table(title=f"{job.name}: {replicas} workers x {job.spec.procs_per_replica} ranks")
    for column in ("index", "name", "ranks", "command", "rendezvous", "checkpoints", "metrics port"):
        table.add_column(column)
    for p in plans:
        table.add_row(str(p.index), p.name, f"{p.first_rank}-{p.last_rank}", " ".join(p.argv),
                      f"{p.env['PET_RDZV_BACKEND']} {p.env['PET_RDZV_ENDPOINT']} nnodes {p.env['PET_NNODES']}",
                      p.env["FLYWHEEL_CHECKPOINT_DIR"], p.env["FLYWHEEL_METRICS_PORT"])
    console.print(table)
    if layout:
        console.print(_layout_table(layout, args.top))
    return 0


def _plan_layout(spec: TrainingJobSpec, replicas: int, args: argparse.Namespace) -> PlanResult | None:
    """The planner's layouts for the job at this size (none for a user command: its script owns parallelism)."""
    import yaml

    from flywheel.planner import device_table
    from flywheel.spec.auto import plan_for_spec
    from flywheel.spec.pod import planner_device

    if spec.command:
        return None
    overrides = None
    if args.devices:
        with open(args.devices) as f:
            overrides = yaml.safe_load(f)
    table = device_table(overrides, source=args.devices or "built-in")
    device = args.device or planner_device(spec.pod_view())  # default: the job's (its accelerator's device, else cpu)
    if device not in table:
        raise ValueError(f"--device {device}: unknown; use one of {', '.join(table)} or add it with --devices")
    return plan_for_spec(spec, replicas * spec.procs_per_replica, table[device])


def _layout_table(result: PlanResult, top: int) -> Table:
    from rich.table import Table

    title = (f"layouts on {result.world_size} x {result.device.name} ({result.ranks_per_worker} per worker), "
             f"fastest first; {result.rejected_for_memory} do not fit")
    table = Table(title=title)
    for column in ("", "dp", "tp", "pp", "micro batch", "micro batches", "sharding", "recompute", "est step s",
                   "est memory GiB", "comm s", "bubble"):
        table.add_column(column, justify="right")
    for i, e in enumerate(result.candidates[:top]):
        lay = e.layout
        table.add_row("chosen" if i == 0 else str(i + 1), str(lay.dp), str(lay.tp), str(lay.pp),
                      str(lay.micro_batch), str(e.microbatches),
                      (f"zero{lay.zero}" if lay.fsdp else "ddp") + (f" ep{lay.ep}" if lay.ep > 1 else ""),
                      "yes" if lay.activation_checkpointing else "no", f"{e.step_seconds:.3f}",
                      f"{e.memory_bytes / 2**30:.2f}", f"{e.communication_seconds:.3f}", f"{e.bubble_fraction:.0%}")
    return table


def _operator(args: argparse.Namespace) -> int:
    from flywheel.operator.main import run  # kopf and the kube client load only for this subcommand

    return run(args.args, serve_api=_serve_cluster_api)


def _serve_cluster_api(args: argparse.Namespace) -> None:
    """`flywheel operator --api-port`: the REST API in a thread of the operator process, from its own cache."""
    from flywheel.api.app import create_app
    from flywheel.api.server import ServerConfig, ThreadedServer, attach

    namespace = args.namespace[0] if len(args.namespace) == 1 else None
    cfg = ServerConfig(kubeconfig=args.kubeconfig, namespace=namespace, token_file=args.api_token_file or None,
                       etcd_endpoints=args.etcd_endpoints)
    ThreadedServer(create_app(startup=lambda a: attach(a, cfg)), args.api_host, args.api_port).start()
    print(f"flywheel operator: REST API on http://{args.api_host}:{args.api_port}/v1/jobs", flush=True)


def _api(args: argparse.Namespace) -> int:
    import uvicorn

    from flywheel.api.app import create_app
    from flywheel.api.auth import AuthConfigError, TokenFileAuth
    from flywheel.api.server import ServerConfig, attach

    cfg = ServerConfig(kubeconfig=args.kubeconfig, namespace=args.namespace, token_file=args.token_file,
                       read_only=args.read_only, etcd_endpoints=args.etcd_endpoints)
    if cfg.token_file:
        try:
            TokenFileAuth.from_file(cfg.token_file)  # fail here, with the file's problem, not at first request
        except AuthConfigError as err:
            print(f"flywheel api: {err}", file=sys.stderr)
            return EXIT_BAD_INPUT
    app = create_app(startup=lambda a: attach(a, cfg))
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _status(args: argparse.Namespace) -> int:
    from rich.console import Console

    from flywheel.api.client import StatusError, StatusOptions, fetch, render

    opts = StatusOptions(job=args.job, namespace=args.namespace, phase=args.phase, server=args.server,
                         token=args.token, token_file=args.token_file, output=args.output)
    try:
        body = fetch(opts)
    except StatusError as err:
        print(f"flywheel status: {err}", file=sys.stderr)
        return 1
    out = render(body, opts.output)
    if isinstance(out, str):
        print(out)
    else:
        Console(width=140).print(out)
    return 0


def _export(args: argparse.Namespace) -> int:
    from flywheel.layout.hf_config import HFConfigError
    from flywheel.trainer.models.hf_export import ExportError, export_hf

    try:
        step_dir = export_hf(args.source, args.out)
    except (ExportError, HFConfigError) as err:
        print(f"flywheel export: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"wrote {args.out} (Hugging Face, from {step_dir})")
    return 0


def _prepare_data(args: argparse.Namespace) -> int:
    from flywheel.data.prepare import PrepareError, prepare_data, progress_reporter
    from flywheel.data.tokenizers import TokenizerError

    update, close = progress_reporter("tokenizing")
    try:
        index = prepare_data(args.inputs, args.tokenizer, args.out, shard_tokens=args.shard_tokens,
                             workers=args.workers, dtype=args.dtype, progress=update)
    except (PrepareError, TokenizerError) as err:
        print(f"flywheel prepare-data: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        close()
    print(f"wrote {args.out}: {index.total_tokens} tokens ({index.dtype}, vocab {index.vocab}) in "
          f"{len(index.shards)} shards")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from flywheel.layout.hf_config import HFConfigError
    from flywheel.trainer.generate import GenerateOptions, generate_text
    from flywheel.trainer.models.hf_export import ExportError

    options = GenerateOptions(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                              seed=args.seed)
    try:
        print(generate_text(args.source, args.prompt, options, tokenizer=args.tokenizer))
    except (ExportError, HFConfigError, ValueError) as err:
        print(f"flywheel generate: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


def _add_data_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    prep = sub.add_parser("prepare-data", help="tokenize text/JSONL/Parquet files into token shards for data.source")
    prep.add_argument("inputs", nargs="+", metavar="INPUT", help=".txt, .jsonl (a `text` field) or .parquet files")
    prep.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer.json or a .tiktoken file")
    prep.add_argument("--out", required=True, help="the shard directory to write (give it as data.source)")
    prep.add_argument("--shard-tokens", type=int, default=1 << 28, help="tokens per shard file (default 2^28)")
    prep.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="tokenizing processes")
    prep.add_argument("--dtype", choices=("auto", "uint16", "uint32"), default="auto",
                      help="token width (auto: uint16 when the vocab fits)")
    prep.set_defaults(func=_prepare_data)

    gen = sub.add_parser("generate", help="sample text from a trained model (a run or checkpoint directory)")
    gen.add_argument("source", metavar="RUN_OR_CHECKPOINT",
                     help="a run directory (runs/<name>), a checkpoint directory or one step-NNNNNNNN folder")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep this much probability mass")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--tokenizer", help="decode with this tokenizer instead of the job's")
    gen.set_defaults(func=_generate)


def _render(args: argparse.Namespace) -> int:
    from flywheel.operator import render

    return render.run(args)


def _crd(args: argparse.Namespace) -> int:
    from flywheel.spec.crd import generate as crd

    if args.stdout:
        sys.stdout.write(crd.render_crd())
    else:
        print(f"wrote {crd.write_crd(args.path)}")
        print(f"wrote {crd.write_spec_reference()}")  # docs/spec.md, from the same schema
    return 0


def _non_negative_int(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {raw!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flywheel", description="Elastic, fault-tolerant training.")
    parser.add_argument("--version", action="version", version=f"flywheel {__version__}")
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    _add_local_commands(sub)
    _add_cluster_commands(sub)
    _add_model_commands(sub)
    _add_data_commands(sub)
    crd = sub.add_parser("crd", help="write the TrainingJob CRD generated from the schema")
    crd.add_argument("path", nargs="?", default="crds/trainingjobs.flywheel.dev.yaml")
    crd.add_argument("--stdout", action="store_true", help="print instead of writing a file")
    crd.set_defaults(func=_crd)
    return parser


def _add_local_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """run, launch and plan: a job on this machine, one worker's agent, and what a job would start."""
    run = sub.add_parser("run", help="run a TrainingJob on this machine")
    run.add_argument("job", help="TrainingJob YAML")
    run.add_argument("--out", help="output directory (default runs/<name>/)")
    run.add_argument("--fault", action="append", metavar="SPEC",
                     help="inject a fault: kill:rank=R:step=S, hang:rank=R:step=S, lose-worker:replica=I:step=S")
    run.add_argument("--checkpoint-dir", help="override spec.checkpoint.dir")
    run.add_argument("--spares", type=_non_negative_int, default=None, metavar="N",
                     help="keep N warm spare workers that replace a lost worker (default: spec.replicas.spares)")
    run.add_argument("--no-progress", action="store_true", help="plain progress lines instead of a live bar")
    run.add_argument("--metrics-port-base", type=int, default=0, metavar="P",
                     help="worker i serves Prometheus metrics on P+i (default: none)")
    run.add_argument("--api-port", type=int, default=0, metavar="PORT",
                     help="serve the job read-only on 127.0.0.1:PORT with the REST API (docs/api.md)")
    run.add_argument("--api-token-file", help="static tokens for --api-port (default: a fresh one in OUT/api-token)")
    run.set_defaults(func=_run)

    launch = sub.add_parser("launch", help="run torch's elastic agent for one worker (configured by PET_* env)",
                            description="Run inside a worker: `flywheel launch [-- user command ...]`.")
    launch.add_argument("command", nargs=argparse.REMAINDER, help="user command after --; default: the trainer")
    launch.set_defaults(func=_launch)

    plan = sub.add_parser("plan", help="show the workers a job would start and the planner's layouts")
    plan.add_argument("job", help="TrainingJob YAML")
    plan.add_argument("-o", "--output", choices=("table", "json"), default="table")
    plan.add_argument("--replicas", type=int, help="workers to plan (default: spec.replicas target or max)")
    plan.add_argument("--checkpoint-dir", help="override spec.checkpoint.dir")
    plan.add_argument("--metrics-port-base", type=int, default=0, metavar="P")
    plan.add_argument("--device", help="device kind for the layout planner: cpu, a100, h100, h200 or one from "
                      "--devices (default: the job's, spec.accelerator.device or parallelism.device, else cpu)")
    plan.add_argument("--devices", metavar="FILE", help="YAML overriding or adding device entries (planner/devices.py)")
    plan.add_argument("--top", type=int, default=8, help="layouts to show (default 8)")
    plan.set_defaults(func=_plan)


def _add_cluster_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """render, operator, api and status: the cluster side."""
    from flywheel.operator.render import add_arguments as add_render_arguments  # argparse only; imports nothing heavy

    render = sub.add_parser("render", help="print the Service and worker Pods the operator would create for a job")
    add_render_arguments(render)
    render.set_defaults(func=_render)

    operator = sub.add_parser("operator", add_help=False, help="run the Kubernetes operator (see --help)")
    operator.add_argument("args", nargs=argparse.REMAINDER, help="operator options; `flywheel operator --help`")
    operator.set_defaults(func=_operator)

    api = sub.add_parser("api", help="serve the REST status API for the cluster's TrainingJobs",
                         description="Serve /v1/jobs... from a watch-backed cache; see docs/api.md.")
    api.add_argument("--host", default="127.0.0.1")
    api.add_argument("--port", type=int, default=8700)
    api.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                     help="default $KUBECONFIG, else the in-cluster service account")
    api.add_argument("-n", "--namespace", help="serve one namespace only (default: all)")
    api.add_argument("--token-file", help="static tokens (token,user,uid[,\"groups\"]) instead of TokenReview + "
                                          "SubjectAccessReview")
    api.add_argument("--read-only", action="store_true", help="refuse the actions (501)")
    api.add_argument("--etcd-endpoints", default=os.environ.get("FLYWHEEL_ETCD_ENDPOINTS", ""), metavar="HOST:PORT,...",
                     help="the operator's etcd: step, loss, tokens/s, checkpoint and goodput of running jobs from the "
                          "workers' progress records (default: the TrainingJob status; env FLYWHEEL_ETCD_ENDPOINTS)")
    api.add_argument("--log-level", default="info")
    api.set_defaults(func=_api)

    status = sub.add_parser("status", help="show TrainingJobs (or one) from the REST API")
    status.add_argument("job", nargs="?", help="NAME or NAMESPACE/NAME; default: list the jobs")
    status.add_argument("-n", "--namespace")
    status.add_argument("--phase", help="list only jobs in this phase")
    status.add_argument("-o", "--output", choices=("table", "json"), default="table")
    status.add_argument("--server", help="API URL (default $FLYWHEEL_API_URL or http://127.0.0.1:8700)")
    status.add_argument("--token", help="bearer token (default $FLYWHEEL_API_TOKEN)")
    status.add_argument("--token-file", help="a file holding the bearer token")
    status.set_defaults(func=_status)


def _add_model_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    export = sub.add_parser("export", help="write a checkpoint as a Hugging Face model directory")
    export.add_argument("source", metavar="RUN_OR_CHECKPOINT",
                        help="a run directory (runs/<name>), a checkpoint directory or one step-NNNNNNNN folder")
    export.add_argument("--format", choices=("hf",), default="hf", help="hf: config.json + safetensors (default)")
    export.add_argument("--out", required=True, help="the directory to write")
    export.set_defaults(func=_export)


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
