"""The command line: bad input exits 2 with the field named, `plan` and `crd` output, both entry points."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml
from conftest import PYTHON, REPO, child_env, write_job


def _cli(*args: str, cwd=REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "flywheel.cli", *args], cwd=cwd, env=child_env(COLUMNS="200"),
                          capture_output=True, text=True, timeout=60)


def test_bad_spec_exits_2_naming_the_field(tmp_path):
    job = write_job(tmp_path / "bad.yaml", "bad", "  replicas: {min: 3, max: 2}\n")
    proc = _cli("run", str(job), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "spec.replicas" in proc.stdout and "min (3) is greater than max (2)" in proc.stdout
    assert not (tmp_path / "out").exists()  # nothing started


def test_bad_fault_flag_and_missing_file_exit_2(tmp_path):
    proc = _cli("run", str(REPO / "examples" / "tiny.yaml"), "--fault", "kill:rank=9:step=1")
    assert proc.returncode == 2 and "rank=9 does not exist" in proc.stdout
    assert _cli("run", str(tmp_path / "missing.yaml")).returncode == 2


def test_plan_json_lists_every_worker_with_its_contract_env():
    proc = _cli("plan", "examples/tiny.yaml", "-o", "json", "--metrics-port-base", "9100")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    plans = out["workers"]
    assert [p["ranks"] for p in plans] == [[0, 1], [2, 3]]
    assert [p["env"]["FLYWHEEL_METRICS_PORT"] for p in plans] == ["9100", "9101"]
    assert {p["env"]["PET_NNODES"] for p in plans} == {"2:2"}
    chosen = out["layout"]["chosen"]
    assert chosen["dp"] * chosen["tp"] * chosen["pp"] == 4 and chosen["est_memory_bytes"] > 0
    assert out["layout"]["candidates"][0] == chosen
    table = _cli("plan", "examples/user-script.yaml")
    assert table.returncode == 0 and "examples/scripts/train_user.py" in table.stdout
    assert "layouts on" not in table.stdout  # a user command owns its parallelism


def test_plan_device_choice_and_bad_device_files(tmp_path):
    proc = _cli("plan", "examples/tiny.yaml", "--device", "h100", "--top", "3")
    assert proc.returncode == 0, proc.stderr
    assert "layouts on 4 x h100" in proc.stdout and "chosen" in proc.stdout
    bad = tmp_path / "devices.yaml"
    bad.write_text("h100: {memory: 3}\n")
    proc = _cli("plan", "examples/tiny.yaml", "--device", "h100", "--devices", str(bad))
    assert proc.returncode == 2 and "devices.h100.memory: unknown field" in proc.stdout
    proc = _cli("plan", "examples/tiny.yaml", "--device", "tpu")
    assert proc.returncode == 2 and "--device tpu: unknown" in proc.stdout


def test_crd_writes_the_generated_schema(tmp_path):
    proc = _cli("crd", str(tmp_path / "crd.yaml"))
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load((tmp_path / "crd.yaml").read_text())
    assert doc["kind"] == "CustomResourceDefinition"
    assert _cli("crd", "--stdout").stdout == (tmp_path / "crd.yaml").read_text()


def test_console_script_is_installed():
    proc = subprocess.run([str(Path(PYTHON).parent / "flywheel"), "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0
    assert all(cmd in proc.stdout for cmd in ("run", "launch", "plan", "operator", "api", "status"))
