"""A warm spare's promotion record and the local runner's promotion file (flywheel/contracts/spare_promotion.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from flywheel.contracts import replica
from flywheel.contracts.spare_promotion import (
    Promotion,
    PromotionError,
    decode_promotion,
    encode_promotion,
    read_promotion_file,
    wait_for_promotion_file,
    write_promotion,
)
from flywheel.etcd import keys


def test_a_promotion_round_trips_and_always_carries_its_replica_index() -> None:
    raw = encode_promotion(1, {"FLYWHEEL_MEMORY_CKPT_DIR": "/run/w1", "FLYWHEEL_REPLICA_INDEX": "7"})
    promotion = decode_promotion(raw)
    assert promotion == Promotion("1", {"FLYWHEEL_MEMORY_CKPT_DIR": "/run/w1", "FLYWHEEL_REPLICA_INDEX": "7"})
    # The record's replica wins over a stale index in its env: rank = replica index must hold.
    assert promotion.env_to_apply() == {"FLYWHEEL_MEMORY_CKPT_DIR": "/run/w1", "FLYWHEEL_REPLICA_INDEX": "1"}
    assert decode_promotion('{"replica": "02"}') == Promotion("2", {})


@pytest.mark.parametrize("raw, names", [
    ("not json", "JSON"),
    ("[1]", "JSON object"),
    ('{"env": {}}', "`replica`"),
    ('{"replica": "a"}', "`replica`"),
    ('{"replica": "-1"}', "`replica`"),
    ('{"replica": "0", "env": {"A": 1}}', "`env`"),
    ('{"replica": "0", "env": []}', "`env`"),
])
def test_a_malformed_promotion_is_refused_naming_the_field(raw: str, names: str) -> None:
    with pytest.raises(PromotionError, match=names):
        decode_promotion(raw)


def test_the_promotion_file_is_written_whole_and_waited_for(tmp_path: Path) -> None:
    path = tmp_path / "promote.json"
    stop = threading.Event()
    assert read_promotion_file(path) is None
    writer = threading.Timer(0.2, write_promotion, (path, 3, {"A": "b"}))
    began = time.monotonic()
    writer.start()
    promotion = wait_for_promotion_file(path, stop)
    assert promotion == Promotion("3", {"A": "b"})
    assert 0.15 <= time.monotonic() - began < 2.0
    assert [p.name for p in tmp_path.iterdir()] == ["promote.json"]  # no temporary file left behind


def test_waiting_for_the_promotion_file_ends_when_stopped(tmp_path: Path) -> None:
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    assert wait_for_promotion_file(tmp_path / "never.json", stop) is None


def test_spare_env_and_keys() -> None:
    assert replica.is_spare({replica.SPARE_ENV: "1"}) and not replica.is_spare({})
    assert not replica.is_spare({replica.SPARE_ENV: "0"})
    assert keys.spare_key("job", "job-spare-0") == b"/flywheel/spares/job/job-spare-0"
    assert keys.promote_key("job", "spare-1") == b"/flywheel/promote/job/spare-1"
    assert keys.spares_prefix("job") == b"/flywheel/spares/job/"
    with pytest.raises(ValueError, match="spare id"):
        keys.spare_key("job", "a/b")
