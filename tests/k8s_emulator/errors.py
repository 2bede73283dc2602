"""The emulated API server's error, `StatusError`: answered as a metav1.Status with the HTTP code and reason a real
API server uses."""

from __future__ import annotations

from typing import Any


class StatusError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None,
                 list_meta: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}
        self.list_meta = list_meta or {}  # e.g. the inconsistent continue token of an expired one

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": dict(self.list_meta),
                                "status": "Failure",
                                "message": self.message, "reason": self.reason, "code": self.code}
        if not self.reason:
            del body["reason"]  # a Status the handler returns itself may carry none (eviction.py's 500)
        if self.details:
            body["details"] = self.details
        return body

    def headers(self) -> dict[str, str]:
        """What the API server adds to the answer: Retry-After from details.retryAfterSeconds (client-go then waits
        and retries by itself)."""
        seconds = self.details.get("retryAfterSeconds")
        return {"Retry-After": str(seconds)} if seconds else {}

    @classmethod
    def not_found(cls, group_kind: str, name: str) -> StatusError:
        return cls(404, "NotFound", f'{group_kind} "{name}" not found', {"name": name, "kind": group_kind})

    @classmethod
    def already_exists(cls, group_kind: str, name: str) -> StatusError:
        return cls(409, "AlreadyExists", f'{group_kind} "{name}" already exists', {"name": name, "kind": group_kind})

    @classmethod
    def conflict(cls, group_kind: str, name: str) -> StatusError:
        return cls(409, "Conflict", f'Operation cannot be fulfilled on {group_kind} "{name}": the object has been '
                   "modified; please apply your changes to the latest version and try again",
                   {"name": name, "kind": group_kind})

    @classmethod
    def invalid(cls, group_kind: str, name: str, causes: list[str]) -> StatusError:
        return cls(422, "Invalid", f'{group_kind} "{name}" is invalid: ' + ", ".join(causes),
                   {"name": name, "kind": group_kind, "causes": [_cause(c) for c in causes]})

    @classmethod
    def bad_request(cls, message: str) -> StatusError:
        return cls(400, "BadRequest", message)


def _cause(text: str) -> dict[str, str]:
    """`spec.x: Invalid value: ...` -> a StatusCause with the field split out, as kubectl prints it."""
    field, sep, message = text.partition(": ")
    if not sep or " " in field:
        return {"reason": "FieldValueInvalid", "message": text}
    return {"reason": "FieldValueInvalid", "message": message, "field": field}
