"""Prometheus rules: promtool checks them and runs their unit tests; a wrong expectation must fail the run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.monitoring.prometheus_server import PROMTOOL_BINARY

RULES_DIR = Path(__file__).resolve().parents[2] / "monitoring" / "rules"
RULES = RULES_DIR / "flywheel.rules.yaml"
ALERTS = {"TrainingStalled", "TrainingRestartingOften", "CheckpointFailing", "CheckpointStale", "GoodputLow",
          "GPUFatalXid", "GPULowUtilization", "OperatorDown"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL_BINARY, *args], capture_output=True, text=True, timeout=120)


def test_rules_are_valid() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 8 rules found" in result.stdout


def test_every_alert_exists_and_has_a_firing_unit_test() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    defined = {r["alert"] for g in groups for r in g["rules"]}
    assert defined == ALERTS
    tested = set()
    for path in sorted((RULES_DIR / "tests").glob("*.yaml")):
        for case in yaml.safe_load(path.read_text())["tests"]:
            tested |= {t["alertname"] for t in case.get("alert_rule_test", []) if t["exp_alerts"]}
    assert tested == ALERTS


def test_rule_unit_tests_pass() -> None:
    tests = sorted(str(p) for p in (RULES_DIR / "tests").glob("*.yaml"))
    result = promtool("test", "rules", *tests)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    original = RULES_DIR / "tests" / "flywheel.rules.test.yaml"
    doc = yaml.safe_load(original.read_text())
    doc["rule_files"] = [str(RULES)]
    for case in doc["tests"]:  # expect the stalled job to be called healthy
        for check in case.get("alert_rule_test", []):
            for alert in check["exp_alerts"]:
                if alert["exp_labels"].get("job") == "stuck":
                    alert["exp_labels"]["job"] = "healthy"
    broken = tmp_path / "broken.test.yaml"
    broken.write_text(yaml.safe_dump(doc))
    result = promtool("test", "rules", str(broken))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED" in result.stdout + result.stderr and "TrainingStalled" in result.stdout + result.stderr
