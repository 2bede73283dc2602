"""RFC 3339 timestamps, the one pair used everywhere: Kubernetes writes (conditions, events, annotations) and reads
(pod and job times, whatever offset form the API server or a user chose)."""

from __future__ import annotations

import datetime as dt
import time


def rfc3339(t: float | None = None) -> str:
    """Seconds since the epoch (now when None) as RFC 3339 in UTC to the second with a Z: the form Kubernetes
    writes, and one that sorts as a string."""
    return dt.datetime.fromtimestamp(time.time() if t is None else t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str | None) -> float | None:
    """An RFC 3339 time (Z or an offset, fractions allowed) as seconds since the epoch; None for "" or None. A time
    without an offset is read as UTC. Raises ValueError for anything else."""
    if not text:
        return None
    parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()
