"""One RFC 3339 pair (flywheel/contracts/timefmt.py) and the labels defined once (flywheel/contracts/labels.py)."""

from __future__ import annotations

import pytest

from flywheel.contracts import labels
from flywheel.contracts.timefmt import parse_rfc3339, rfc3339
from flywheel.spec.crd import generate as crd

T = 1767268800.0  # 2026-01-01T12:00:00Z


def test_rfc3339_writes_utc_seconds_with_a_z_and_reads_every_offset_form() -> None:
    assert rfc3339(T) == "2026-01-01T12:00:00Z" and rfc3339(T + 0.9) == "2026-01-01T12:00:00Z"
    assert rfc3339().endswith("Z") and len(rfc3339()) == 20
    for text in ("2026-01-01T12:00:00Z", "2026-01-01T12:00:00+00:00", "2026-01-01T13:00:00+01:00",
                 "2026-01-01T12:00:00", "2026-01-01t12:00:00z"):
        assert parse_rfc3339(text) == T, text
    assert parse_rfc3339("2026-01-01T12:00:00.250000Z") == T + 0.25  # the API server's micro time
    assert parse_rfc3339("") is None and parse_rfc3339(None) is None
    assert parse_rfc3339(rfc3339(T)) == T
    with pytest.raises(ValueError):
        parse_rfc3339("yesterday")


def test_labels_live_in_the_trainingjob_api_group() -> None:
    assert labels.GROUP == crd.GROUP
    assert labels.RESTART_ANNOTATION == "flywheel.dev/restart-requested-at"
    assert (labels.JOB_LABEL, labels.INDEX_LABEL, labels.GENERATION_LABEL) == (
        "flywheel.dev/job", "flywheel.dev/replica-index", "flywheel.dev/generation")
