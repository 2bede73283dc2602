"""Field rules: one definition of a check on a TrainingJob field, decided the same way in two places. In Python
(`problems`, for `flywheel run/plan` and the operator's validation) and, as what the rule puts on its node of the
CRD's OpenAPI schema (`attach`: CEL `x-kubernetes-validations`, or a schema keyword such as `enum`, `minimum`,
`maxItems` or `pattern`), by the API server at `kubectl apply`. Pure.

A rule sits on a path relative to `spec`: dotted field names, `[]` after a list field for each of its items, and
`{}` for each value of a map ("template.spec.containers[].ports[].name", "resources.limits.{}"). Its message says
what the value must be and how to fix it; Python prefixes the field (with indices and keys), the API server the
same path.

CEL's cost budget: the API server refuses a CRD whose rules may cost too much on the largest object the schema
allows, so every list and map above a CEL rule must be bounded (`Bound`: maxItems/maxProperties, which `attach`
insists on) and every string a rule reads (`Text` sets maxLength).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from flywheel.spec.k8s_syntax import Syntax, cel_string


def nodes(doc: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(concrete path, value) of every node at `path` in `doc`; absent and null nodes are skipped."""
    yield from _walk(doc, path.split(".") if path else [], "")


def _walk(value: Any, parts: list[str], where: str) -> Iterator[tuple[str, Any]]:
    if not parts:
        if value is not None:
            yield where, value
        return
    head, rest = parts[0], parts[1:]
    if head == "{}":
        if isinstance(value, dict):
            for key, item in value.items():
                yield from _walk(item, rest, f"{where}.{key}")
        return
    name = head.removesuffix("[]")
    if not isinstance(value, dict) or value.get(name) is None:
        return
    here = f"{where}.{name}" if where else name
    if head.endswith("[]"):
        if isinstance(value[name], list):
            for i, item in enumerate(value[name]):
                yield from _walk(item, rest, f"{here}[{i}]")
        return
    yield from _walk(value[name], rest, here)


@dataclass(frozen=True)
class Rule(ABC):
    """The base: a rule on the node at `path`. `sub_field` names the field under it that its message is about."""

    path: str
    message: str
    sub_field: str = ""

    @abstractmethod
    def violated(self, value: Any) -> list[str]:
        """The sub-paths (relative to the node, "" for the node itself) where `value` breaks the rule."""

    @abstractmethod
    def schema(self) -> dict[str, Any]:
        """Keywords this rule sets on its schema node (CEL rules included)."""

    def _cel(self, rule: str) -> dict[str, Any]:
        out = {"rule": rule, "message": self.message}
        if self.sub_field:
            out["fieldPath"] = f".{self.sub_field}"
        return {"x-kubernetes-validations": [out]}


@dataclass(frozen=True)
class Text(Rule):
    """A string of a Syntax; empty passes unless `required`."""

    syntax: Syntax = field(default=None)  # type: ignore[assignment]
    required: bool = False

    def violated(self, value: Any) -> list[str]:
        if not isinstance(value, str) or (value == "" and not self.required):
            return []
        return [] if self.syntax.ok(value) else [""]

    def schema(self) -> dict[str, Any]:
        check = self.syntax.cel("self")
        return {"maxLength": self.syntax.max_length,
                **self._cel(check if self.required else f"self == '' || ({check})")}


@dataclass(frozen=True)
class Keys(Rule):
    """Every key of a map is of a Syntax (each bad key is named)."""

    syntax: Syntax = field(default=None)  # type: ignore[assignment]

    def violated(self, value: Any) -> list[str]:
        return [f".{key}" for key in value if not self.syntax.ok(key)] if isinstance(value, dict) else []

    def schema(self) -> dict[str, Any]:
        return self._cel(f"self.all(k, {self.syntax.cel('k')})")


@dataclass(frozen=True)
class Enum(Rule):
    """One of `values` (the schema's enum: the API server lists them when it refuses)."""

    values: tuple[Any, ...] = ()

    def violated(self, value: Any) -> list[str]:
        return [] if value in self.values else [""]

    def schema(self) -> dict[str, Any]:
        return {"enum": list(self.values)}


@dataclass(frozen=True)
class Range(Rule):
    """An integer within [low, high] (the schema's minimum/maximum)."""

    low: int | None = None
    high: int | None = None

    def violated(self, value: Any) -> list[str]:
        if not isinstance(value, int) or isinstance(value, bool):
            return []
        return [""] if (self.low is not None and value < self.low) or \
                       (self.high is not None and value > self.high) else []

    def schema(self) -> dict[str, Any]:
        out = {} if self.low is None else {"minimum": self.low}
        return out if self.high is None else {**out, "maximum": self.high}


@dataclass(frozen=True)
class Bound(Rule):
    """At most `most` items of a list, entries of a map or characters of a string."""

    most: int = 0
    keyword: str = "maxItems"  # maxItems | maxProperties | maxLength

    def violated(self, value: Any) -> list[str]:
        return [""] if isinstance(value, (list, dict, str)) and len(value) > self.most else []

    def schema(self) -> dict[str, Any]:
        return {self.keyword: self.most}


@dataclass(frozen=True)
class UniqueBy(Rule):
    """A list whose items differ in `keys`, required fields: a list-map to the API server (which refuses a
    duplicate at no CEL cost), checked item by item in Python (each repeat is named)."""

    keys: tuple[str, ...] = ("name",)

    def violated(self, value: Any) -> list[str]:
        if not isinstance(value, list):
            return []
        seen: list[tuple[Any, ...]] = []
        out = []
        for i, item in enumerate(value):
            key = tuple(item.get(k) for k in self.keys) if isinstance(item, dict) else ()
            if key and None not in key and key in seen:
                out.append(f"[{i}]" + (f".{self.keys[0]}" if len(self.keys) == 1 else ""))
            seen.append(key)
        return out

    def schema(self) -> dict[str, Any]:
        return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(self.keys)}


@dataclass(frozen=True)
class IntOrText(Rule):
    """An int-or-string node (a quantity, a port): a string of `syntax` (the schema's pattern: CEL would be priced
    as if the string were as long as a whole request), an integer within [low, high]."""

    syntax: Syntax = field(default=None)  # type: ignore[assignment]
    low: int = 0
    high: int | None = None

    def violated(self, value: Any) -> list[str]:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            return [""]
        if isinstance(value, str):
            return [] if self.syntax.ok(value) else [""]
        return [] if value >= self.low and (self.high is None or value <= self.high) else [""]

    def schema(self) -> dict[str, Any]:
        bound = f"self >= {self.low}" + ("" if self.high is None else f" && self <= {self.high}")
        (pattern,) = self.syntax.patterns
        return {"pattern": f"^({pattern})$", "maxLength": self.syntax.max_length,
                **self._cel(f"type(self) == string || ({bound})")}


@dataclass(frozen=True)
class Check(Rule):
    """A decision of its own: `ok` in Python and `cel` in CEL, on the node (`self`)."""

    cel: str = ""
    ok: Callable[[Any], bool] = field(default=lambda _: True, compare=False)
    # Where under the node it is broken, when Python can say more precisely than the node (and sub_field): the
    # sub-paths (".containers[1].volumeMounts[0].name"). Defaults to the node when `ok` is false.
    find: Callable[[Any], list[str]] | None = field(default=None, compare=False)

    def violated(self, value: Any) -> list[str]:
        if self.ok(value):
            return []
        found = self.find(value) if self.find is not None else []
        return found or [f".{self.sub_field}" if self.sub_field else ""]

    def schema(self) -> dict[str, Any]:
        return self._cel(self.cel)


def problems(doc: dict[str, Any], rules: list[Rule], prefix: str = "") -> list[str]:
    """Every rule's problems in `doc` (the spec as written, camelCase), each "field: message"."""
    out = []
    for rule in rules:
        for where, value in nodes(doc, rule.path):
            out += [f"{prefix}{(where + sub).lstrip('.')}: {rule.message}" for sub in rule.violated(value)]
    return out


def attach(schema: dict[str, Any], rules: list[Rule]) -> dict[str, Any]:
    """`schema` (the spec's structural schema, changed in place and returned) with every rule on its node. A CEL
    rule under a list or map that no rule bounds is an error: the API server would price it as unbounded."""
    bounded = {r.path for r in rules if isinstance(r, Bound)}
    for rule in rules:
        node = schema_node(schema, rule.path)
        keywords = rule.schema()
        if "x-kubernetes-validations" in keywords:
            _check_bounded(rule.path + (".{}" if isinstance(rule, Keys) else ""), bounded)
            # A new list: the node's may be a module's own (spec/crd/generate.py's rules), which a second build must not
            # see grown.
            node["x-kubernetes-validations"] = [*node.get("x-kubernetes-validations", []),
                                                *keywords.pop("x-kubernetes-validations")]
        node.update(keywords)
    return schema


def _check_bounded(path: str, bounded: set[str]) -> None:
    parts = path.split(".")
    for i, part in enumerate(parts):
        above = ".".join(parts[:i] + [part.removesuffix("[]")])
        if (part.endswith("[]") or (i + 1 < len(parts) and parts[i + 1] == "{}")) and above not in bounded:
            raise ValueError(f"{path}: the CEL rule sits under {above}, which no Bound limits")


def schema_node(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """The schema node at a rule path (KeyError naming the path when the schema has no such field)."""
    node = schema
    for part in path.split(".") if path else []:
        if part == "{}":
            node = node["additionalProperties"]
            continue
        try:
            node = node["properties"][part.removesuffix("[]")]
        except KeyError:
            raise KeyError(f"the schema has no field {path!r} (at {part!r})") from None
        if part.endswith("[]"):
            node = node["items"]
    return node


def one_of(fields: tuple[str, ...], var: str = "self") -> str:
    """CEL: how many of `fields` are set on `var`."""
    return "[" + ", ".join(f"has({var}.{f})" for f in fields) + "].filter(x, x).size()"


def cel_in(var: str, values: tuple[str, ...]) -> str:
    return f"{var} in [{', '.join(cel_string(v) for v in values)}]"
