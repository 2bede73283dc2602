"""A worker's reason for a non-zero exit: written once to the termination message file, read back by the operator
from the pod's state.terminated.message into the failure condition."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.contracts import exitcodes
from flywheel.contracts import termination_log as t
from flywheel.operator import manifests as m
from flywheel.operator.observe import pod_view
from flywheel.policy.failure_decision import decide_failure
from flywheel.policy.observed import ObservedProgress
from flywheel.spec.status import ConditionType
from flywheel.trainer.entry import main
from tests.builders import fresh, pod, spec, view
from tests.operator.test_manifests_progress import JOB, SETTINGS


def test_the_first_reason_wins_and_a_missing_or_unwritable_path_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    env = {t.ENV: str(path)}
    assert t.write_reason("ModuleNotFoundError: No module named 'nope'", env)
    assert not t.write_reason("rank 0: exit code 1 (crash)", env)  # the agent's view comes second
    assert path.read_text() == "ModuleNotFoundError: No module named 'nope'"
    assert not t.write_reason("x", {}) and not t.write_reason("x", {t.ENV: str(tmp_path / "no" / "such")})
    assert not t.write_reason("x", {t.ENV: str(tmp_path)})  # a directory: OSError, skipped


def test_clear_empties_the_file_so_the_next_reason_wins(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    env = {t.ENV: str(path)}
    assert t.write_reason("RuntimeError: CUDA error: unspecified launch failure", env)
    t.clear(env)
    assert t.write_reason("torch.OutOfMemoryError: CUDA out of memory", env)
    assert path.read_text() == "torch.OutOfMemoryError: CUDA out of memory"
    t.clear({t.ENV: str(tmp_path / "no" / "such")})  # nothing to empty: skipped
    t.clear({})


def test_reasons_name_the_exception_s_last_line_or_the_signal() -> None:
    assert t.exception_reason(ValueError("bad\nconfig: lr must be > 0\n")) == "ValueError: config: lr must be > 0"
    assert t.exit_reason(137) == "killed by SIGKILL" and t.exit_reason(-15) == "killed by SIGTERM"
    assert t.exit_reason(1) == "exit code 1 (crash)"


def test_the_pod_asks_for_the_termination_message_and_names_its_path_to_the_worker() -> None:
    body = m.pod(JOB, m.plan(JOB, "0123456789abcdef", SETTINGS, None)[0], 0, SETTINGS)
    container = body["spec"]["containers"][0]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert {e["name"]: e["value"] for e in container["env"]}[t.ENV] == "/dev/termination-log"


def test_pod_view_takes_the_last_line_of_the_terminated_message() -> None:
    obj = {"metadata": {"name": "j-worker-0", "uid": "u", "labels": {m.INDEX_LABEL: "0"}},
           "status": {"phase": "Failed", "containerStatuses": [{"state": {"terminated": {
               "exitCode": 1, "reason": "Error",
               "message": "Traceback (most recent call last):\n  ...\nImportError: cannot import name 'x'\n\n"}}}]}}
    view = pod_view(obj, set())
    assert view is not None and view.message == "ImportError: cannot import name 'x'"


def test_the_failure_condition_and_event_carry_the_worker_s_reason() -> None:
    said = "ModuleNotFoundError: No module named 'nope'"
    s = spec(**{"faultTolerance.maxRestarts": 0})
    out = decide_failure(fresh(), view(s, [pod(0), pod(1, "Failed", exit_code=1, message=said)]))
    assert out is not None
    failed = next(c for c in out.status.conditions if c.type == ConditionType.FAILED)
    assert failed.message.count(said) == 1 and "exit code 1" in failed.message
    assert any(said in e.message for e in out.events)


def test_a_trainer_rank_that_cannot_start_writes_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "termination-log"
    monkeypatch.setenv(t.ENV, str(path))
    assert main({"RANK": "0"}) == exitcodes.USER_ERROR
    assert path.read_text().startswith("UserError: ") and "\n" not in path.read_text()


def test_a_reason_written_is_told_to_the_listeners_first(tmp_path: Path) -> None:
    heard: list[str] = []
    t.add_listener(heard.append)
    try:
        assert not t.write_reason("no file here", {})
        assert t.write_reason("ValueError: x", {t.ENV: str(tmp_path / "msg")})
    finally:
        t.remove_listener(heard.append)
    t.write_reason("after", {})
    assert heard == ["no file here", "ValueError: x"]


def test_an_empty_terminated_message_takes_the_reason_from_the_progress_key() -> None:
    said = "RuntimeError: CUDA error: an illegal memory access"
    s = spec(**{"faultTolerance.maxRestarts": 0})
    out = decide_failure(fresh(), view(s, [pod(0), pod(1, "Failed", exit_code=1)],
                                       progress=ObservedProgress(failure_reason=said)))
    assert out is not None
    failed = next(c for c in out.status.conditions if c.type == ConditionType.FAILED)
    assert said in failed.message and "exit code 1" in failed.message
