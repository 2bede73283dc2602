"""Dashboards: regenerating gives the committed JSON byte for byte; every query is valid PromQL (checked by a real
Prometheus with the dashboard variables filled in); every dashboard has the datasource/namespace/job variables."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.monitor import PrometheusClient
from tests.monitoring.prometheus_server import PrometheusServer

DASHBOARDS = Path(__file__).resolve().parents[2] / "monitoring" / "dashboards"
BUILD = DASHBOARDS / "build.py"
NAMES = ["flywheel-cluster.json", "flywheel-gpu.json", "flywheel-job.json"]


def build(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BUILD), *args], capture_output=True, text=True, timeout=120)


def test_regenerating_is_byte_identical(tmp_path: Path) -> None:
    result = build("--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == NAMES
    for name in NAMES:
        assert (tmp_path / name).read_bytes() == (DASHBOARDS / name).read_bytes(), f"{name}: run {BUILD}"
    assert build("--check").returncode == 0


def test_check_detects_a_hand_edit(tmp_path: Path) -> None:
    for name in NAMES:
        (tmp_path / name).write_text((DASHBOARDS / name).read_text())
    edited = tmp_path / "flywheel-job.json"
    edited.write_text(edited.read_text().replace('"Loss"', '"Loss (edited)"'))
    result = build("--check", "--out", str(tmp_path))
    assert result.returncode == 1 and "flywheel-job.json" in result.stderr


def load(name: str) -> dict:
    return json.loads((DASHBOARDS / name).read_text())


@pytest.mark.parametrize("name", NAMES)
def test_variables_and_datasources(name: str) -> None:
    board = load(name)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for var in ("namespace", "job"):
        assert variables[var]["type"] == "query" and variables[var]["multi"] and variables[var]["includeAll"]
    ids = [p["id"] for p in board["panels"]]
    assert len(set(ids)) == len(ids) and board["uid"].startswith("flywheel-")
    for panel in board["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]


def expressions() -> list[tuple[str, str, str]]:
    out = []
    for name in NAMES:
        board = load(name)
        for panel in board["panels"]:
            out += [(name, panel["title"], t["expr"]) for t in panel["targets"]]
        out += [(name, v["name"], v["definition"]) for v in board["templating"]["list"] if v["type"] == "query"]
    return out


def fill(expr: str) -> str:
    """What Grafana substitutes: all-values regexes, the rate interval and the range."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__range", "1h")
    expr = re.sub(r"\$(namespace|job|node)\b", ".*", expr)
    match = re.fullmatch(r"label_values\((.+), \w+\)", expr)
    return f"count({match.group(1)})" if match else expr


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    server = PrometheusServer(tmp_path, [])
    try:
        async def check() -> list[str]:
            bad = []
            async with PrometheusClient(server.url, timeout_s=5) as client:
                for name, title, expr in expressions():
                    try:
                        await client.query(fill(expr))
                    except Exception as err:  # noqa: BLE001 - collect every failure, then report them together
                        bad.append(f"{name} / {title}: {err}")
            return bad

        assert asyncio.run(check()) == []
    finally:
        server.stop()
    assert len(expressions()) >= 30
