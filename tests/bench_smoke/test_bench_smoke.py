"""CI smoke of each benchmark: the smallest case runs end to end and writes a well-formed result. The numbers
themselves are judged by `make bench` (bench/), never by a timed test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIELDS = {"metric", "value", "unit", "peer", "peer_value", "ratio", "goal", "pass", "runs", "machine"}

pytestmark = pytest.mark.slow


def run_bench(tmp_path: Path, module: str, *args: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", FLYWHEEL_BENCH_RESULTS=str(tmp_path))
    result = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def check_record(path: Path) -> dict:
    record = json.loads(path.read_text())
    assert FIELDS <= set(record), FIELDS - set(record)
    assert record["value"] > 0 and record["peer_value"] > 0 and record["ratio"] > 0
    return record


def test_checkpoint_stall_smoke(tmp_path):
    out = tmp_path / "checkpoint_stall.json"
    run_bench(tmp_path, "bench.checkpoint_stall", "--quick", "--reps", "1", "--out", str(out))
    record = check_record(out)
    assert set(record["runs"]) >= {"flywheel Checkpointer", "flywheel Checkpointer, memory tier on"}
    [memory_row] = record["rows"]
    assert memory_row["value"] > 0 and memory_row["peer_value"] == record["value"]


def test_checkpoint_restore_smoke(tmp_path):
    out = tmp_path / "checkpoint_restore.json"
    run_bench(tmp_path, "bench.checkpoint_restore", "--quick", "--reps", "1", "--out", str(out))
    record = check_record(out)
    sources = {"disk (warm)", "disk (cold)", "memory-own", "memory-peer (gloo)", "memory-peer (same host)"}
    floor = "gloo send/recv of the same bytes"  # the transport alone, beside the sources
    assert set(record["runs"]) == set(record["seconds"]) == sources | {floor}
    assert record["warm_disk_seconds"] > 0 and record["cold_disk_seconds"] > 0 and record["seconds"][floor] > 0
    assert set(record["ratio_to_warm_disk"]) == set(record["ratio_to_cold_disk"]) == sources
    # each memory source against the cold and the warm disk restore, then the peer restore against its transport
    assert len(record["rows"]) == 7
    assert record["rows"][-1]["peer"] == floor and record["rows"][-1]["pass"] is None


def test_trainer_overhead_smoke(tmp_path):
    # One model (the rows differ only in the model spec): each run is two rank processes, most of it their start.
    run_bench(tmp_path, "bench.trainer_overhead", "--rounds", "1", "--steps", str(4 + 3), "--model", "llama-tiny")
    record = check_record(tmp_path / "trainer_overhead.json")
    assert [row["model"] for row in record["runs"]] == ["llama-tiny"]


def test_parallel_parity_smoke(tmp_path):
    run_bench(tmp_path, "bench.parallel_parity", "--quick")
    record = json.loads((tmp_path / "parallel_parity.json").read_text())
    assert FIELDS <= set(record) and record["pass"]
    assert [row["layout"] for row in record["runs"]] == ["tp2+sp", "llama tp2+sp"]


def test_restart_latency_smoke(tmp_path):
    out = tmp_path / "restart_latency.json"
    # torchrun as typed may never re-form after the kill (pytorch#135712): its trial then counts as the timeout.
    run_bench(tmp_path, "bench.restart_latency", "--quick", "--out", str(out))
    record = check_record(out)
    assert record["stats"]["fixed"]["flywheel"]["recovered"] == 1


def test_planner_accuracy_smoke(tmp_path):
    run_bench(tmp_path, "bench.planner_accuracy", "--quick")
    record = check_record(tmp_path / "planner_accuracy.json")
    layouts = record["runs"]["layouts"]
    assert {r["config"] for r in layouts} == {"base", "capped"} and any("pp2" in r["layout"] for r in layouts)
    assert layouts and all(r["peak_live_bytes"] > 0 and r["est_memory_bytes"] > 0 for r in layouts)


@pytest.mark.cluster  # the bench starts the test cluster (tests/conftest.py cannot see it)
def test_hang_recovery_smoke(tmp_path):
    if not (REPO / ".tools" / "bin" / "kubectl").exists() or not shutil.which("prometheus"):
        pytest.skip("kubectl or prometheus missing: run scripts/install-tools.sh")
    # --quick shortens torchrun's wait to a 3 s gloo timeout (its trial then takes ~30 s for the stopped rank).
    run_bench(tmp_path, "bench.hang_recovery", "--quick")
    record = check_record(tmp_path / "hang_recovery.json")
    # The stopped rank is recovered by the monitor's Hung restart or, first, by its agent restarting the ranks in
    # place once its peer's collective timed out (RankRestarted): either way detected and resumed.
    (trial,) = record["runs"]["flywheel"]
    assert trial["detected_by"] in ("Hung", "RankRestarted") and trial["detect_s"] > 0
    assert trial["resume_s"] > 0 and record["value"] == trial["resume_s"]
    # Without Prometheus (etcd progress only), every rank stopped: still seen as Hung and recovered.
    assert [t["detected_by"] for t in record["runs"]["flywheel-etcd"]] == ["Hung"]
    assert record["runs"]["flywheel-etcd"][0]["resume_s"] > 0
    assert [row["name"] for row in record["rows"]] == ["no Prometheus"]


def test_api_latency_smoke(tmp_path):
    run_bench(tmp_path, "bench.api_latency", "--duration", "2", "--rate", "20", "--jobs", "20", "--rounds", "1")
    record = check_record(tmp_path / "api_latency.json")
    assert record["runs"]["ours"]["errors"] == 0 and record["runs"]["ours"]["requests"] == 40
    assert record["runs"]["peer"]["errors"] == 0


@pytest.mark.cluster  # the bench starts the test cluster (tests/conftest.py cannot see it)
def test_operator_scale_smoke(tmp_path):
    if not (REPO / ".tools" / "bin" / "kubectl").exists() or not shutil.which("etcd"):
        pytest.skip("kubectl or etcd missing: run scripts/install-tools.sh")
    run_bench(tmp_path, "bench.operator_scale", "--smoke")
    record = check_record(tmp_path / "operator_scale.json")
    runs = record["runs"]
    for side in ("burst", "kopf_peer", "bare_client"):
        assert runs[side]["all_pods_seen"] == runs[side]["jobs"] == 20, side
    assert runs["kopf_peer"]["cpu_s"] > 0 and all(s is not None and s > 0 for s in runs["wide"]["latency_s"])
    assert set(record["goals"]) == {"api_requests_per_job_minute", "operator_cpu_ratio", "burst_throughput_ratio",
                                    "wide_pods_p99_s", "operator_rss_peak_mb"}
    assert record["api_requests_per_job_minute"] >= 0 and record["operator_cpu_seconds_per_job"] > 0
    assert record["burst_throughput_ratio"] > 0 and 0 < record["operator_rss_peak_mb"] < 1000
    assert [row["name"] for row in record["rows"]] == ["burst", "burst_bare", "requests", "wide", "rss"]


@pytest.mark.cluster  # the bench starts the test cluster (tests/conftest.py cannot see it)
def test_dead_worker_smoke(tmp_path):
    if not (REPO / ".tools" / "bin" / "kubectl").exists() or not shutil.which("etcd"):
        pytest.skip("kubectl or etcd missing: run scripts/install-tools.sh")
    run_bench(tmp_path, "bench.dead_worker", "--quick")
    record = check_record(tmp_path / "dead_worker.json")
    ours, peer = record["runs"]["ours"][0], record["runs"]["peer"][0]
    assert ours["reason"] == peer["reason"] == "NodeLost"
    assert ours["detect_s"] < ours["replacement_running_s"] < ours["first_step_s"]


def test_goodput_smoke(tmp_path):
    """Ours and the tuned torchrun each train ~8 s with one rank SIGKILLed and recover from it (ours-memory: the
    full run, and tests/integration's memory-tier recoveries)."""
    sides = {"ours", "torchrun-tuned"}
    out = tmp_path / "goodput.json"
    run_bench(tmp_path, "bench.goodput", "--quick", "--out", str(out))
    record = check_record(out)
    assert set(record["runs"]["period_6s"]) == sides
    for side, run in record["runs"]["period_6s"].items():
        assert run["finished"] and run["summary"]["faults"] == 1, (side, run["useful_steps"], run["pace_s"])
        assert run["summary"]["recovered"] == run["summary"]["faults"], side


def test_goodput_user_script_smoke(tmp_path):
    """The Hugging Face example under flywheel run and under the tuned torchrun each train a short run with one
    rank SIGKILLed, recover, finish, and have their restart latency measured."""
    out = tmp_path / "goodput_user_script.json"
    run_bench(tmp_path, "bench.goodput_user_script", "--quick", "--out", str(out))
    record = check_record(out)
    assert set(record["runs"]["faulted"]) == {"ours", "torchrun-tuned"}
    for side, run in record["runs"]["faulted"].items():
        assert run["finished"] and run["summary"]["faults"] == 1, (side, run["useful_steps"], run["ended_by"])
        assert run["summary"]["recovered"] == 1 and run["summary"]["restart_median_s"] > 0, side
    assert [row["name"] for row in record["rows"]] == ["restart vs torchrun-tuned"]


def test_gpu_check_smoke(tmp_path):
    """The GPU script's harness on tiny models (a lent GPU runs it for real): the launcher starts ranks, the
    determinism probe compares passes, a killed run resumes to the unkilled run's parameters."""
    out = tmp_path / "gpu_check.json"
    run_bench(tmp_path, "bench.gpu_check", "--smoke", "--only", "launch", "--only", "determinism", "--only",
              "resume", "--cases", "gpt-125m-fp32-memory", "--no-rerun", "--timeout", "200",
              "--out", str(out))
    record = json.loads(out.read_text())
    assert record["launch"]["exit"] == 0 and record["launch"]["steps"] == 5
    assert record["determinism"]["math"]["bitwise_repeatable"] is True
    for row in record["exact_resume"].values():
        assert row["exit"] == [0, 0] and row["starts_of_killed_run"] == 2 and row["equal"], row
    # the memory case (the plain disk case's checks and more): restored from this worker's own memory copy
    assert record["exact_resume"]["gpt-125m-fp32-memory"]["restores_of_killed_run"][0][0] == "memory-own"
