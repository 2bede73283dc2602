"""REPORT.md: a row and a PNG plot per benchmark result, "(not run)" for a missing one."""

from __future__ import annotations

from bench.common import write_result
from bench.report import write_report


def test_report_has_a_row_and_a_plot_per_result(tmp_path):
    write_result("fast", metric="latency", value=1.5, unit="s", peer="torchrun", peer_value=30.0, goal="<= 3 s",
                 passed=True, runs=[], path=tmp_path / "fast.json")
    write_result("slow", metric="p50 ratio", value=2.9, unit="s", peer="1 job", peer_value=0.015, goal="ratio <= 2",
                 passed=False, runs=[], path=tmp_path / "slow.json", quick=True)
    report = write_report(("fast", "slow", "missing"), tmp_path).read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ")][1:]
    assert rows[0].startswith("| fast | latency | 1.5 s | torchrun | 30 | 0.05 |")
    assert rows[0].endswith("| yes | full |")
    assert rows[1].endswith("| NO (quick: not judged) | quick |") and rows[2].startswith("| missing | (not run)")
    for name in ("fast", "slow"):
        assert f"![{name}]({name}.png)" in report
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "missing.png").exists()


def test_readme_table_is_replaced_between_its_markers(tmp_path):
    from bench.report import README_BEGIN, README_END, update_readme

    write_result("fast", metric="latency", value=1.5, unit="s", peer="torchrun", peer_value=30.0, goal="<= 3 s",
                 passed=True, runs=[], path=tmp_path / "fast.json")
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n## Performance\n\n{README_BEGIN}\n| old |\n{README_END}\n\nhow to reproduce\n")
    assert update_readme(("fast",), tmp_path, readme)
    text = readme.read_text()
    assert "| old |" not in text and "| fast | latency | 1.5 s | torchrun |" in text
    assert text.endswith(f"{README_END}\n\nhow to reproduce\n")
    plain = tmp_path / "PLAIN.md"
    plain.write_text("no markers\n")
    assert not update_readme(("fast",), tmp_path, plain) and plain.read_text() == "no markers\n"


def test_a_result_from_the_quick_lanes_says_so(tmp_path, monkeypatch):
    import bench.__main__ as entry

    assert sorted(entry.CPU_LANE + entry.CLUSTER_LANE) == sorted(entry.BENCHMARKS)
    monkeypatch.setenv("FLYWHEEL_BENCH_LANES", "1")
    write_result("laned", metric="latency", value=1.5, unit="s", peer="torchrun", peer_value=30.0, goal="<= 3 s",
                 passed=True, runs=[], path=tmp_path / "laned.json", quick=True)
    report = write_report(("laned",), tmp_path).read_text()
    assert "| yes | quick (lanes) |" in report


def test_a_result_with_several_figures_has_a_row_for_each(tmp_path):
    extra = [{"name": "burst", "metric": "jobs/s", "value": 40.0, "unit": "jobs/s", "peer": "bare client",
              "peer_value": 100.0, "ratio": 0.4, "goal": "ratio >= 0.5", "pass": False},
             {"name": "rss", "metric": "RSS", "value": 150.0, "unit": "MB", "peer": "goal", "peer_value": 200.0,
              "ratio": 0.75, "goal": "<= 200 MB", "pass": True}]
    write_result("scale", metric="cpu per job", value=0.02, unit="s/job", peer="kopf", peer_value=0.01,
                 goal="ratio <= 1.5", passed=False, runs={}, path=tmp_path / "scale.json", rows=extra)
    report = write_report(("scale",), tmp_path).read_text()
    rows = [line for line in report.splitlines() if line.startswith("| scale")]
    assert rows[0].startswith("| scale | cpu per job | 0.02 s/job | kopf | 0.01 | 2 |") and "| NO | full |" in rows[0]
    assert rows[1].startswith("| scale: burst | jobs/s | 40 jobs/s | bare client | 100 | 0.4 | ratio >= 0.5 | NO |")
    assert rows[2].startswith("| scale: rss | RSS | 150 MB | goal | 200 | 0.75 | <= 200 MB | yes |")
