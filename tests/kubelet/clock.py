"""The test cluster's timestamps: RFC 3339 in UTC, to the second, as the API server writes metav1.Time (a leaf
module, so that every part can use it without an import cycle)."""

from __future__ import annotations

import datetime


def now_rfc3339(offset_seconds: float = 0) -> str:
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=offset_seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
