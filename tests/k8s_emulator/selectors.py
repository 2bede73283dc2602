"""Label selectors (=, ==, !=, in, notin, exists, !exists) and field selectors (=, ==, !=) as the API parses them."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tests.k8s_emulator.errors import StatusError

Predicate = Callable[[dict[str, Any]], bool]

_SET_TERM = re.compile(r"^\s*([A-Za-z0-9._/-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_TERM = re.compile(r"^\s*([A-Za-z0-9._/-]+)\s*(==|!=|=)\s*([A-Za-z0-9._-]*)\s*$")
_EXISTS_TERM = re.compile(r"^\s*(!?)\s*([A-Za-z0-9._/-]+)\s*$")


def _split_terms(selector: str) -> list[str]:
    """Split on commas that are not inside a parenthesised value set."""
    terms: list[str] = []
    current: list[str] = []
    depth = 0
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return [t for t in terms if t.strip()]


def _label_term(term: str) -> Callable[[dict[str, str]], bool]:
    if match := _SET_TERM.match(term):
        key, op, raw = match.groups()
        values = {v.strip() for v in raw.split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if match := _EQ_TERM.match(term):
        key, op, value = match.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if match := _EXISTS_TERM.match(term):
        negate, key = match.groups()
        if negate:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise StatusError.bad_request(f"unable to parse requirement: {term!r}")


def label_selector(selector: str | None) -> Predicate:
    if not selector:
        return lambda obj: True
    terms = [_label_term(t) for t in _split_terms(selector)]

    def matches(obj: dict[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(term(labels) for term in terms)

    return matches


def match_label_selector_object(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector object ({matchLabels, matchExpressions}) against labels."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), set(expr.get("values") or [])
        present = key in labels
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and present and labels[key] in values) \
                or (op == "Exists" and not present) or (op == "DoesNotExist" and present):
            return False
    return True


def field_value(obj: dict[str, Any], path: str) -> str:
    """A dotted field path as a selector sees it: missing fields are the empty string."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, dict):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def field_selector(selector: str | None) -> Predicate:
    if not selector:
        return lambda obj: True
    checks: list[tuple[str, bool, str]] = []
    for term in _split_terms(selector):
        match = _EQ_TERM.match(term) or re.match(r"^\s*([A-Za-z0-9._/-]+)\s*(==|!=|=)\s*(.*?)\s*$", term)
        if not match:
            raise StatusError.bad_request(f"invalid field selector term: {term!r}")
        path, op, value = match.groups()
        checks.append((path, op == "!=", value))

    def matches(obj: dict[str, Any]) -> bool:
        return all((field_value(obj, path) != value) if negate else (field_value(obj, path) == value)
                   for path, negate, value in checks)

    return matches
