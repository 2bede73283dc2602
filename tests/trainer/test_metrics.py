import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from flywheel.trainer.metrics import TrainerMetrics

from .workers import free_port

LABELS = {"job": "tiny", "namespace": "ns", "replica": "1", "rank": "3"}


def scrape(port: int) -> dict[str, list]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_metrics_are_served_with_design_names_and_labels():
    port = free_port()
    metrics = TrainerMetrics(port, LABELS)
    metrics.record_step(loss=2.5, step_seconds=0.2, tokens_per_second=1000.0, timestamp=1700000000.0)
    metrics.checkpoint_blocking_seconds.observe(0.05)
    metrics.checkpoint_total_seconds.observe(1.5)
    metrics.checkpoint_last_step.set(50)
    metrics.checkpoint_memory_bytes.set(4096)
    metrics.checkpoint_failures_total.labels(reason="no_space").inc()
    metrics.rendezvous_seconds.set(1.25)
    families = scrape(port)

    def value(sample_name: str) -> float:
        family = sample_name.removesuffix("_total").removesuffix("_count").removesuffix("_sum")
        (sample,) = [s for s in families[family] if s.name == sample_name]
        assert sample.labels == LABELS  # never a step label
        return sample.value

    assert value("flywheel_train_steps_total") == 1
    assert value("flywheel_train_last_step_timestamp_seconds") == 1700000000.0
    assert value("flywheel_train_loss") == 2.5
    assert value("flywheel_train_tokens_per_second") == 1000.0
    assert value("flywheel_train_step_seconds_count") == 1
    assert value("flywheel_checkpoint_blocking_seconds_sum") == 0.05
    assert value("flywheel_checkpoint_total_seconds_count") == 1
    assert value("flywheel_checkpoint_last_step") == 50
    assert value("flywheel_checkpoint_memory_bytes") == 4096
    failures = {s.labels["reason"]: s.value for s in families["flywheel_checkpoint_failures"]
                if s.name == "flywheel_checkpoint_failures_total"}
    assert failures == {"no_space": 1, "permission": 0, "io_error": 0, "other": 0}
    assert value("flywheel_rendezvous_seconds") == 1.25
    assert value("flywheel_watchdog_fired_total") == 0


def test_registries_are_private_and_port_zero_serves_nothing():
    a, b = TrainerMetrics(0, LABELS), TrainerMetrics(0, dict(LABELS, rank="4"))
    a.train_steps_total.inc()
    assert b.registry.get_sample_value("flywheel_train_steps_total", dict(LABELS, rank="4")) == 0
    assert a.registry.get_sample_value("flywheel_train_steps_total", LABELS) == 1


def test_missing_labels_are_rejected():
    with pytest.raises(ValueError, match="replica"):
        TrainerMetrics(0, {"job": "j", "namespace": "n", "rank": "0"})
