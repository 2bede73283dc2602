"""A warm spare's promotion: what it says, its JSON, and the local runner's file that carries it.

A spare is started like a worker but with FLYWHEEL_SPARE=1 and no replica index (flywheel/contracts/replica.py). Whoever
replaces a lost worker (the operator on a cluster, the local supervisor under `flywheel run`) promotes a waiting spare
by handing it {"replica": "<index>", "env": {"NAME": "VALUE", ...}}: the replica index it takes and the env that
differs for that replica (at least FLYWHEEL_REPLICA_INDEX). On a cluster the JSON is the value of an etcd key
(flywheel/etcd/spares.py); locally it is the file named by FLYWHEEL_SPARE_PROMOTION_FILE, written with an atomic
rename and polled by the spare every 0.05 s.

Dependency-free: the agent reads it before importing anything heavy, the supervisor without etcd.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from flywheel.contracts.replica import REPLICA_INDEX_ENV

POLL_INTERVAL_S = 0.05


class PromotionError(ValueError):
    """A promotion record that does not say which replica to become."""


@dataclass(frozen=True)
class Promotion:
    replica: str  # the replica index the spare takes (a decimal string, as FLYWHEEL_REPLICA_INDEX is)
    env: dict[str, str] = field(default_factory=dict)  # the env that differs for that replica

    def env_to_apply(self) -> dict[str, str]:
        """The env the promoted agent sets: the record's, with the replica index always its own."""
        return {**self.env, REPLICA_INDEX_ENV: self.replica}


def encode_promotion(replica: str | int, env: Mapping[str, str]) -> bytes:
    promotion = Promotion(_checked_replica(str(replica)), {str(k): str(v) for k, v in env.items()})
    return json.dumps({"replica": promotion.replica, "env": promotion.env}, sort_keys=True).encode()


def decode_promotion(raw: bytes | str) -> Promotion:
    """The promotion in `raw`; PromotionError when it is not {"replica": "<index>", "env": {...}}."""
    try:
        record = json.loads(raw)
    except ValueError as err:
        raise PromotionError(f"a spare promotion is not JSON: {err}") from None
    if not isinstance(record, dict):
        raise PromotionError("a spare promotion must be a JSON object with `replica` and `env`")
    env = record.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise PromotionError("a spare promotion's `env` must map names to string values")
    return Promotion(_checked_replica(str(record.get("replica", ""))), {str(k): v for k, v in env.items()})


def _checked_replica(replica: str) -> str:
    if not replica.isdigit():
        raise PromotionError(f"a spare promotion's `replica` must be a replica index (0, 1, ...), got {replica!r}")
    return str(int(replica))


# --- the local file ---------------------------------------------------------------------------------------------------

def write_promotion(path: str | os.PathLike[str], replica: str | int, env: Mapping[str, str]) -> None:
    """Promote the local spare that polls `path` (atomic: the spare never reads half a record)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(encode_promotion(replica, env))
    os.replace(tmp, target)


def ready_marker(path: str | os.PathLike[str]) -> Path:
    """The file a local spare creates beside its promotion file once its trainer is imported."""
    target = Path(path)
    return target.with_name(target.name + ".ready")


def mark_ready(path: str | os.PathLike[str]) -> None:
    ready_marker(path).touch()


def is_ready(path: str | os.PathLike[str]) -> bool:
    return ready_marker(path).exists()


def read_promotion_file(path: str | os.PathLike[str]) -> Promotion | None:
    try:
        return decode_promotion(Path(path).read_bytes())
    except FileNotFoundError:
        return None


def wait_for_promotion_file(path: str | os.PathLike[str], stop: threading.Event,
                            poll_s: float = POLL_INTERVAL_S) -> Promotion | None:
    """Wait until the promotion file appears (its promotion) or `stop` is set (None)."""
    while not stop.is_set():
        promotion = read_promotion_file(path)
        if promotion is not None:
            return promotion
        stop.wait(poll_s)
    return None

