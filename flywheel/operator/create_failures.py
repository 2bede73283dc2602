"""Why the objects a pass asked for could not be created (a worker pod, the headless Service: a quota, an admission
webhook, the API itself refused), kept for the next pass's ReplicaFailure condition (policy/create_failures.py).
The CreateFailed event says it once per cause; the condition says it for as long as it lasts."""

from __future__ import annotations

# A failure no create tried again for this long is about an object no longer wanted (the job scaled down, or was
# restarted under other names): forgotten. Retries come every few seconds (job_actions.CREATE_RETRY_SECONDS).
STALE_SECONDS = 60.0


class CreateFailures:
    def __init__(self) -> None:
        self._by_name: dict[str, tuple[str, float]] = {}  # object name -> (message, when it last failed)
        self.recorded = 0  # failures recorded so far: a pass's batch of creates stops after one

    def failed(self, name: str, message: str, now: float) -> None:
        self._by_name[name] = (message, now)
        self.recorded += 1

    def created(self, name: str) -> None:
        self._by_name.pop(name, None)

    def current(self, existing: set[str], now: float) -> tuple[str, ...]:
        """The messages of the failures still open, by object name: those of objects that exist now (created
        since, by a retry this runner did not see answer, or by someone else) and stale ones are dropped."""
        self._by_name = {name: (message, at) for name, (message, at) in self._by_name.items()
                         if name not in existing and now - at < STALE_SECONDS}
        return tuple(message for _, (message, _) in sorted(self._by_name.items()))
