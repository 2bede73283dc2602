"""A small Prometheus HTTP API client: instant queries (`/api/v1/query`) with a hard timeout.

Every failure becomes a `PrometheusError` with a short `reason` (one of metrics.QUERY_ERROR_REASONS) so the health
loop can meter it by kind and carry on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported when a client is made: the operator without Prometheus never loads httpx
    import httpx


@dataclass(frozen=True)
class Sample:
    """One element of an instant vector."""

    labels: dict[str, str]
    value: float
    timestamp: float


class PrometheusError(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class PrometheusClient:
    """`timeout_s` bounds each query end to end (connect, send, wait, read); Prometheus is also told to give up
    at the same time so a slow query does not keep running there."""

    def __init__(self, base_url: str, timeout_s: float = 5.0, transport: httpx.AsyncBaseTransport | None = None):
        import httpx

        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._client = httpx.AsyncClient(base_url=self.base_url, timeout=httpx.Timeout(timeout_s),
                                         transport=transport)

    async def query(self, promql: str) -> list[Sample]:
        """Evaluate `promql` now; it must give an instant vector (a scalar becomes one sample without labels)."""
        import httpx

        try:
            # Prometheus durations take no fractions ("1.5s" is a 400): say it in milliseconds.
            params = {"query": promql, "timeout": f"{max(1, round(self.timeout_s * 1000))}ms"}
            response = await self._client.get("/api/v1/query", params=params)
        except httpx.TimeoutException as err:
            raise PrometheusError("timeout", f"no answer from {self.base_url} within {self.timeout_s}s "
                                             f"({type(err).__name__})") from None
        except httpx.HTTPError as err:
            raise PrometheusError("connection", f"cannot reach {self.base_url}: {err or type(err).__name__}") from None
        try:
            body: Any = response.json()
        except ValueError:
            raise PrometheusError("http" if response.status_code >= 400 else "bad_response",
                                  f"HTTP {response.status_code} from {self.base_url}, not a Prometheus answer: "
                                  f"{response.text[:200]!r}") from None
        if not isinstance(body, dict):
            raise PrometheusError("bad_response", f"unexpected answer from {self.base_url}: {str(body)[:200]}")
        if body.get("status") != "success":
            # 400 bad_data / 422 execution errors are the query's fault; 5xx and the rest are the server's.
            reason = "query" if body.get("errorType") in ("bad_data", "execution") else "http"
            raise PrometheusError(reason, f"HTTP {response.status_code} {body.get('errorType')}: "
                                          f"{body.get('error')} (query: {promql})")
        return _parse(body.get("data"), promql)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> PrometheusClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _parse(data: Any, promql: str) -> list[Sample]:
    try:
        kind, result = data["resultType"], data["result"]
        if kind == "vector":
            return [Sample(dict(item["metric"]), float(item["value"][1]), float(item["value"][0])) for item in result]
        if kind == "scalar":
            return [Sample({}, float(result[1]), float(result[0]))]
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise PrometheusError("bad_response", f"malformed result for {promql}: {err!r}") from None
    raise PrometheusError("query", f"{promql} gives a {kind}, not an instant vector")


def finite(samples: list[Sample]) -> list[Sample]:
    """Drop NaN/Inf values (e.g. a rate over an empty histogram is 0/0)."""
    return [s for s in samples if math.isfinite(s.value)]
