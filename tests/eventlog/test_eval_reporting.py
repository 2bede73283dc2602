"""Evaluation results from the `eval` event to every reader: the typed record and the fold, summary.json, the
operator's progress (event log and etcd record, merged), the TrainingJob status, the REST API (cluster and local
run); and the spec's validation fields."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from flywheel.api.localrun import EventLogSource
from flywheel.api.views import detail, summary
from flywheel.etcd.progress import ProgressRecord, decode, encode
from flywheel.eventlog import Eval, fold, parse_record
from flywheel.local.run_record import RunRecord
from flywheel.monitor.etcd_progress import GoodputSeed, ProgressLedger, merged
from flywheel.operator.event_log import EventLogTail, progress_of
from flywheel.policy.observed import ObservedProgress
from flywheel.spec import SpecError, parse_job
from flywheel.spec.status import TrainingJobStatus
from flywheel.trainer.progress_publisher import ProgressState
from tests.builders import NOW, pod, reconcile, spec
from tests.eventlog.test_consumers import JOB
from tests.eventlog.test_fold import T0, start, step


def evaluation(n: int, t: float, loss: float | None) -> dict:
    perplexity = None if loss is None or loss > 700 else math.exp(loss)  # the writer turns inf into null
    return {"event": "eval", "time": T0 + t, "step": n, "loss": loss, "perplexity": perplexity, "eval_seconds": 0.25,
            "samples": 16}


def replayed() -> list[dict]:
    """Steps 1-4 with evals at 2 and 4; a restart from 2 replays 3 and 4 (the replayed eval at 4 replaces the
    first one), then step 5 and a last eval."""
    return [start(0), step(1, 1), step(2, 2), evaluation(2, 2.1, 3.0), step(3, 3), step(4, 4),
            evaluation(4, 4.1, 2.5), start(6, resumed_from=2, restart_count=1), step(3, 7), step(4, 8),
            evaluation(4, 8.1, 2.4), step(5, 9), evaluation(5, 9.1, 2.2)]


def test_eval_record_parses_and_the_fold_keeps_the_last_per_step() -> None:
    record = parse_record(evaluation(2, 1, 3.0))
    assert record == Eval(T0 + 1, 2, 3.0, math.exp(3.0), 0.25, 16)
    assert parse_record({"event": "eval", "time": 1.0}) is None  # no step: skipped
    diverged = parse_record({"event": "eval", "time": 1.0, "step": 3, "loss": None})
    assert isinstance(diverged, Eval) and diverged.loss is None
    log = fold([r for r in map(parse_record, replayed()) if r is not None])
    assert log.eval_losses() == [(2, 3.0), (4, 2.4), (5, 2.2)]
    assert log.last_eval is not None and (log.last_eval.step, log.last_eval.loss) == (5, 2.2)


def test_summary_json_lists_evals_with_perplexity() -> None:
    record = RunRecord()
    for raw in replayed():
        record.add_event(raw)
    out = record.summary(job="j", status="Succeeded", exit_code=0, world_size=2, start_time=T0, wall_seconds=10)
    assert out["evals"] == [{"step": 2, "loss": 3.0, "perplexity": pytest.approx(math.exp(3.0))},
                            {"step": 4, "loss": 2.4, "perplexity": pytest.approx(math.exp(2.4))},
                            {"step": 5, "loss": 2.2, "perplexity": pytest.approx(math.exp(2.2))}]
    assert (out["final_eval_step"], out["final_eval_loss"]) == (5, 2.2)
    json.dumps(out, allow_nan=False)  # a diverged loss must not make summary.json invalid JSON
    empty = RunRecord().summary(job="j", status="Failed", exit_code=1, world_size=1, start_time=T0, wall_seconds=1)
    assert empty["evals"] == [] and empty["final_eval_loss"] is None and empty["final_eval_step"] is None
    huge = RunRecord()
    huge.add_event(evaluation(1, 1, 1000.0))
    assert huge.summary(job="j", status="Running", exit_code=0, world_size=1, start_time=T0,
                        wall_seconds=1)["evals"][0]["perplexity"] is None


def test_operator_status_takes_the_latest_eval_from_the_log_and_from_etcd(tmp_path: Path) -> None:
    log = fold([r for r in map(parse_record, replayed()) if r is not None])
    from_log = progress_of(log)
    assert (from_log.eval_step, from_log.eval_loss) == (5, 2.2)
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in replayed()))
    assert EventLogTail(path).poll().eval_step == 5

    status = reconcile(spec(), None, TrainingJobStatus(), [pod(0), pod(1)], from_log, NOW).status
    assert (status.eval_step, status.eval_loss) == (5, 2.2)
    assert status.to_json()["evalLoss"] == 2.2 and status.to_json()["evalStep"] == 5
    before = reconcile(spec(), None, TrainingJobStatus(), [pod(0), pod(1)], ObservedProgress(step=3), NOW).status
    assert "evalLoss" not in before.to_json() and before.eval_step == 0

    newer = ObservedProgress(step=6, checkpoint_path="/c/6", checkpoint_step=6, eval_step=6, eval_loss=2.0)
    assert (merged(newer, from_log).eval_step, merged(newer, from_log).eval_loss) == (6, 2.0)
    without = ObservedProgress(step=6, checkpoint_path="/c/6", checkpoint_step=6)
    assert (merged(without, from_log).eval_step, merged(without, from_log).eval_loss) == (5, 2.2)


def test_etcd_record_carries_the_eval_compatibly() -> None:
    record = ProgressRecord(time=2.0, attempt=1.0, step=4, eval_step=4, eval_loss=2.5)
    assert decode(encode(record)) == record
    plain = encode(ProgressRecord(time=2.0, attempt=1.0, step=4))
    assert b"eval" not in plain  # a record without an eval is the one older readers know
    assert decode(plain) == ProgressRecord(time=2.0, attempt=1.0, step=4)
    diverged = decode(encode(ProgressRecord(time=2.0, attempt=1.0, eval_step=3, eval_loss=math.inf)))
    assert diverged is not None and diverged.eval_step == 3 and diverged.eval_loss is None

    state = ProgressState()
    state.observe("start", {"world_size": 2}, 1.0)
    state.observe("step", {"step": 1, "loss": 3.0}, 2.0)
    assert state.observe("eval", {"step": 1, "loss": 2.9}, 3.0) is False  # not urgent: the next put carries it
    assert state.record is not None and (state.record.eval_step, state.record.eval_loss) == (1, 2.9)
    state.observe("start", {"world_size": 2, "resumed_from": 1}, 4.0)  # an in-process restart keeps it
    assert state.record.eval_step == 1

    ledger = ProgressLedger()
    ledger.add(ProgressRecord(time=2.0, attempt=1.0, step=2, eval_step=2, eval_loss=2.9))
    ledger.add(ProgressRecord(time=5.0, attempt=4.0, step=3, resumed_from=2))  # a new process, no eval yet
    progress = ledger.progress(GoodputSeed())
    assert (progress.eval_step, progress.eval_loss) == (2, 2.9)


def test_rest_api_serves_the_evaluation(tmp_path: Path) -> None:
    obj = {"metadata": {"name": "j", "namespace": "ns"}, "spec": {},
           "status": {"phase": "Running", "step": 9, "evalStep": 8, "evalLoss": 2.0}}
    assert summary(obj).eval_loss == 2.0
    shown = detail(obj, [], []).evaluation
    assert shown is not None and (shown.step, shown.loss) == (8, 2.0)
    assert shown.perplexity == pytest.approx(math.exp(2.0))
    assert detail({**obj, "status": {"phase": "Running"}}, [], []).evaluation is None
    assert detail({**obj, "status": {"phase": "Running", "evalStep": 1, "evalLoss": 900.0}}, [], []
                  ).model_dump(by_alias=True)["evaluation"]["perplexity"] is None

    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in replayed()))
    local = EventLogSource(parse_job(JOB), path).jobs()[0]["status"]
    assert (local["evalStep"], local["evalLoss"]) == (5, 2.2)


def _job(data: dict, training: dict | None = None) -> dict:
    doc = json.loads(json.dumps(JOB))
    doc["spec"]["trainer"]["data"] = data
    doc["spec"]["trainer"]["training"].update(training or {})
    return doc


def test_spec_validation_fields() -> None:
    job = parse_job(_job({"validation": "held.bin"}, {"evalEverySteps": 10, "evalSteps": 2}))
    assert job.spec.trainer.data.validation == "held.bin" and job.spec.trainer.training.eval_every_steps == 10
    assert parse_job(_job({"validationFraction": 0.1})).spec.trainer.data.validation_fraction == 0.1
    with pytest.raises(SpecError, match="validation and data.validationFraction are both set"):
        parse_job(_job({"validation": "held.bin", "validationFraction": 0.1}))
    with pytest.raises(SpecError, match="validationFraction"):
        parse_job(_job({"validationFraction": 0.9}))
    with pytest.raises(SpecError, match="data.validation 'held.csv'"):
        parse_job(_job({"validation": "held.csv"}))
    with pytest.raises(SpecError, match="evalSteps"):
        parse_job(_job({}, {"evalSteps": 0}))
