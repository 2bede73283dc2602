"""Build Flywheel's Grafana dashboards (classic dashboard JSON) with grafana-foundation-sdk (pinned: 0.0.21).

    .venv/bin/python monitoring/dashboards/build.py            # rewrite the committed JSON next to this file
    .venv/bin/python monitoring/dashboards/build.py --check    # exit 1 if the committed JSON is out of date
    .venv/bin/python monitoring/dashboards/build.py --out DIR  # write elsewhere

Every dashboard has a `datasource` variable (any Prometheus) and `namespace`/`job` variables; the label
conventions are those of docs/monitoring.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

warnings.filterwarnings("ignore", category=DeprecationWarning, module="grafana_foundation_sdk")

from grafana_foundation_sdk.builders import common as common_builders  # noqa: E402
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries  # noqa: E402
from grafana_foundation_sdk.cog.encoder import JSONEncoder  # noqa: E402
from grafana_foundation_sdk.models import common  # noqa: E402
from grafana_foundation_sdk.models.dashboard import VariableRefresh, VariableSort  # noqa: E402

HERE = Path(__file__).resolve().parent
DS = common.DataSourceRef(type_val="prometheus", uid="${datasource}")
JOB = 'namespace=~"$namespace", job=~"$job"'
GPU_PODS = 'exported_namespace=~"$namespace", exported_pod=~"($job)-worker-[0-9]+"'


def query(expr: str, legend: str = "", instant: bool = False) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).datasource(DS).legend_format(legend or "__auto")
    return q.instant() if instant else q.range()


def series(title: str, unit: str, *queries: prometheus.Dataquery, width: int = 12,
           description: str = "") -> timeseries.Panel:
    panel = timeseries.Panel().title(title).unit(unit).datasource(DS).span(width).height(8)
    for ref, q in zip("ABCDEFGH", queries):
        panel = panel.with_target(q.ref_id(ref))
    return panel.description(description) if description else panel


def single(title: str, unit: str, q: prometheus.Dataquery, width: int = 6, description: str = "",
           show_name: bool = False) -> stat.Panel:
    """A stat of the last value; `show_name` shows the series name instead (e.g. a phase)."""
    panel = (stat.Panel().title(title).unit(unit).datasource(DS).span(width).height(4).with_target(q.ref_id("A"))
             .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
             .graph_mode(common.BigValueGraphMode.NONE)
             .text_mode(common.BigValueTextMode.NAME if show_name else common.BigValueTextMode.VALUE))
    return panel.description(description) if description else panel


def variables(board: dashboard.Dashboard, source_metric: str) -> dashboard.Dashboard:
    """datasource, then namespace and job (multi-select, all by default) read from `source_metric`."""
    board = board.with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
    for name, definition in (("namespace", f"label_values({source_metric}, namespace)"),
                             ("job", f'label_values({source_metric}{{namespace=~"$namespace"}}, job)')):
        board = board.with_variable(
            dashboard.QueryVariable(name).label("TrainingJob" if name == "job" else "Namespace").datasource(DS)
            .query({"query": definition, "refId": "PrometheusVariableQueryEditor-VariableQuery", "qryType": 1})
            .definition(definition).refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*"))
    return board


def base(uid: str, title: str, tags: list[str]) -> dashboard.Dashboard:
    return (dashboard.Dashboard(title).uid(uid).tags(["flywheel", *tags]).editable().time("now-6h", "now")
            .refresh("30s").timezone("browser"))


def job_overview() -> dashboard.Dashboard:
    board = variables(base("flywheel-job", "Flywheel / Training job", ["training"]), "flywheel_train_steps_total")
    panels = [
        single("Phase", "none", query(f"max by (phase) (flywheel_job_phase{{{JOB}}} == 1)", "{{phase}}",
                                      instant=True), description="Phase reported by the operator.", show_name=True),
        single("Goodput", "percentunit", query(f"avg(flywheel_job_goodput_ratio{{{JOB}}})", instant=True)),
        single("Restarts (range)", "none",
               query(f"sum(increase(flywheel_job_restarts_total{{{JOB}}}[$__range]))", instant=True)),
        single("Last checkpoint step", "none", query(f"max(flywheel_checkpoint_last_step{{{JOB}}})", instant=True)),
        series("Step rate", "none",
               query(f"max by (namespace, job) (rate(flywheel_train_steps_total{{{JOB}}}[$__rate_interval]))",
                     "{{namespace}}/{{job}} steps/s")),
        series("Loss", "none", query(f"avg by (namespace, job) (flywheel_train_loss{{{JOB}}})", "{{job}}")),
        series("Tokens per second", "short",
               query(f"max by (namespace, job) (flywheel_train_tokens_per_second{{{JOB}}})", "{{job}}")),
        series("Goodput", "percentunit", query(f"flywheel_job_goodput_ratio{{{JOB}}}", "{{job}}")),
        series("Restarts by reason", "none",
               query(f"sum by (job, reason) (increase(flywheel_job_restarts_total{{{JOB}}}[$__rate_interval]))",
                     "{{job}} {{reason}}")),
        series("Checkpoint stall (loop blocked)", "s",
               query("histogram_quantile(0.95, sum by (job, le) "
                     f"(rate(flywheel_checkpoint_blocking_seconds_bucket{{{JOB}}}[$__rate_interval])))", "{{job}} p95"),
               query("histogram_quantile(0.95, sum by (job, le) "
                     f"(rate(flywheel_checkpoint_total_seconds_bucket{{{JOB}}}[$__rate_interval])))",
                     "{{job}} p95 until committed")),
        series("Step time per rank", "s",
               query(f"sum by (job, replica, rank) (rate(flywheel_train_step_seconds_sum{{{JOB}}}[$__rate_interval]))"
                     f" / sum by (job, replica, rank) "
                     f"(rate(flywheel_train_step_seconds_count{{{JOB}}}[$__rate_interval]))",
                     "{{job}} r{{replica}}/{{rank}}"),
               description="A rank far above the others is a straggler (the job turns Degraded)."),
        series("Seconds since last step", "s",
               query(f"time() - max by (job, replica, rank) (flywheel_train_last_step_timestamp_seconds{{{JOB}}})",
                     "{{job}} r{{replica}}/{{rank}}"),
               description="Hung when above progressTimeoutSeconds on any rank."),
    ]
    for panel in panels:
        board = board.with_panel(panel)
    return board


def cluster_overview() -> dashboard.Dashboard:
    board = variables(base("flywheel-cluster", "Flywheel / Cluster", ["operator"]), "flywheel_job_goodput_ratio")
    ns = 'namespace=~"$namespace"'
    panels = [
        single("Running jobs", "none", query(f'sum(flywheel_operator_jobs{{{ns}, phase="Running"}})', instant=True)),
        single("Restarting jobs", "none",
               query(f'sum(flywheel_operator_jobs{{{ns}, phase="Restarting"}})', instant=True)),
        single("Failed jobs", "none", query(f'sum(flywheel_operator_jobs{{{ns}, phase="Failed"}})', instant=True)),
        single("Mean time to recover", "s",
               query("sum(increase(flywheel_operator_time_to_recover_seconds_sum[$__range])) / "
                     "sum(increase(flywheel_operator_time_to_recover_seconds_count[$__range]))", instant=True)),
        series("Jobs by phase", "none", query(f"sum by (phase) (flywheel_operator_jobs{{{ns}}})", "{{phase}}")),
        series("Recoveries by reason", "none",
               query(f"sum by (reason) (increase(flywheel_job_restarts_total{{{JOB}}}[$__rate_interval]))",
                     "{{reason}}")),
        series("Time to detect / to recover (p50, p95)", "s",
               *[query(f"histogram_quantile({q}, sum by (le) "
                       f"(rate(flywheel_operator_time_to_{what}_seconds_bucket[$__rate_interval])))", f"{what} p{p}")
                 for what in ("detect", "recover") for q, p in ((0.5, 50), (0.95, 95))]),
        series("Goodput per job", "percentunit",
               query(f"flywheel_job_goodput_ratio{{{JOB}}}", "{{namespace}}/{{job}}")),
        series("Badput by cause (fault to first step)", "s",
               query(f"sum by (cause) (increase(flywheel_job_badput_seconds_total{{{JOB}}}[$__rate_interval]))",
                     "{{cause}}")),
        series("Where recovery time goes (p50 per part)", "s",
               query("histogram_quantile(0.5, sum by (le, part) "
                     "(rate(flywheel_operator_recovery_part_seconds_bucket[$__rate_interval])))", "{{part}}")),
        series("Reconcile duration p95", "s",
               query("histogram_quantile(0.95, sum by (le, result) "
                     "(rate(flywheel_operator_reconcile_duration_seconds_bucket[$__rate_interval])))", "{{result}}")),
        series("Health monitor", "none",
               query("sum by (decision) (increase(flywheel_monitor_decisions_total[$__rate_interval]))",
                     "{{decision}}"),
               query("sum by (query, reason) (increase(flywheel_monitor_query_errors_total[$__rate_interval]))",
                     "query error {{query}} {{reason}}"),
               description="Decisions handed to the operator, and failed Prometheus queries."),
    ]
    for panel in panels:
        board = board.with_panel(panel)
    return board


def gpu_health() -> dashboard.Dashboard:
    board = variables(base("flywheel-gpu", "Flywheel / GPU health", ["gpu", "dcgm"]), "flywheel_train_steps_total")
    node_def = f"label_values(DCGM_FI_DEV_GPU_UTIL{{{GPU_PODS}}}, Hostname)"
    board = board.with_variable(
        dashboard.QueryVariable("node").label("Node").datasource(DS)
        .query({"query": node_def, "refId": "PrometheusVariableQueryEditor-VariableQuery", "qryType": 1})
        .definition(node_def).refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True).include_all(True).all_value(".*"))
    node = 'Hostname=~"$node"'
    fatal = 'err_code=~"46|48|62|64|74|79|95|119|120|140"'
    panels = [
        single("GPUs with a fatal XID", "none",
               query(f"count(DCGM_FI_DEV_XID_ERRORS{{{node}, {fatal}}} > 0) or vector(0)", instant=True), width=8),
        single("Mean GPU utilisation", "percent",
               query(f"avg(DCGM_FI_DEV_GPU_UTIL{{{GPU_PODS}}})", instant=True), width=8),
        single("Framebuffer used", "decmbytes", query(f"sum(DCGM_FI_DEV_FB_USED{{{GPU_PODS}}})", instant=True),
               width=8),
        series("GPU utilisation", "percent",
               query(f"DCGM_FI_DEV_GPU_UTIL{{{GPU_PODS}, {node}}}", "{{exported_pod}} {{Hostname}} gpu {{gpu}}")),
        series("Framebuffer memory used", "decmbytes",
               query(f"DCGM_FI_DEV_FB_USED{{{GPU_PODS}, {node}}}", "{{exported_pod}} {{Hostname}} gpu {{gpu}}")),
        series("New XIDs per node", "none",
               query(f"sum by (Hostname, err_code) (changes(DCGM_FI_DEV_XID_ERRORS{{{node}}}[$__rate_interval]))",
                     "{{Hostname}} xid {{err_code}}"),
               description="dcgm-exporter keeps the last XID per GPU: a change is a new event."),
        series("Last XID per GPU", "none",
               query(f"max by (Hostname, gpu, err_code) (DCGM_FI_DEV_XID_ERRORS{{{node}}} > 0)",
                     "{{Hostname}} gpu {{gpu}} xid {{err_code}}"),
               description="Fatal (drain): 46 48 62 64 74 79 95 119 120 140. App-level (restart ranks): "
                           "13 31 43 45 94. Ignored: 63 92."),
    ]
    for panel in panels:
        board = board.with_panel(panel)
    return board


DASHBOARDS: dict[str, Callable[[], dashboard.Dashboard]] = {
    "flywheel-job.json": job_overview, "flywheel-cluster.json": cluster_overview, "flywheel-gpu.json": gpu_health}


def render(builder: dashboard.Dashboard) -> str:
    built = builder.build()
    for index, panel in enumerate(built.panels or [], start=1):
        panel.id_val = index  # stable ids: Grafana needs them unique, the golden test needs them fixed
    return json.dumps(built, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--check", action="store_true", help="compare with the files in --out instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for name, make in DASHBOARDS.items():
        text = render(make())
        path = args.out / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; run {Path(__file__).name} to regenerate", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
