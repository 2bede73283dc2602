"""Structural OpenAPI v3 schemas of custom resources: defaulting, pruning of unknown fields, and validation
(types, required, enum, bounds, lengths, pattern, items, nullable, int-or-string, CEL rules via `cel.py`).

Error messages follow the API server's wording (`spec.x: Invalid value: ...`, `spec.y: Required value`).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from tests.k8s_emulator import cel

Schema = dict[str, Any]
_ROOT_FIELDS = ("apiVersion", "kind", "metadata")


def apply_defaults(value: Any, schema: Schema) -> Any:
    """Fill missing (or null, where not nullable) properties that have a default, recursively."""
    if not schema:
        return value
    if isinstance(value, dict) and schema.get("type", "object") == "object":
        props = schema.get("properties") or {}
        for name, sub in props.items():
            missing = name not in value or (value[name] is None and not sub.get("nullable"))
            if missing and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(value[name], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name in value:
                if name not in props:
                    value[name] = apply_defaults(value[name], extra)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(item, schema["items"]) for item in value]
    return value


def prune(value: Any, schema: Schema, path: str, dropped: list[str]) -> Any:
    """Remove fields the schema does not know (unless it preserves unknown fields); record their paths."""
    if not schema or schema.get("x-kubernetes-preserve-unknown-fields") or schema.get("x-kubernetes-int-or-string"):
        return value
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props is None and extra in (None, True):
            return value
        for name in list(value):
            if path == "" and name in _ROOT_FIELDS:
                continue
            sub = (props or {}).get(name)
            if sub is None and isinstance(extra, dict):
                sub = extra
            if sub is None and extra is not True:
                dropped.append(_join(path, name))
                del value[name]
            elif sub is not None:
                value[name] = prune(value[name], sub, _join(path, name), dropped)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(item, schema["items"], f"{path}[{i}]", dropped) for i, item in enumerate(value)]
    return value


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, (dict, list)) else f'"{type(value).__name__}"'.replace(
        '"dict"', '"object"').replace('"list"', '"array"')


_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def _type_ok(value: Any, schema: Schema) -> bool:
    expected = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):  # a quantity or a port: 2 or "500m", never a list or a map
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    if not expected:
        return True
    if expected == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if expected == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES.get(expected, object))


def validate(value: Any, schema: Schema, path: str, errors: list[str], old: Any = None, has_old: bool = False,
             gaps: list[str] | None = None) -> None:
    """Append one message per violation to `errors`; CEL rules this evaluator cannot run go to `gaps`."""
    if not schema:
        return
    shown = path or "<root>"
    if value is None:
        if not schema.get("nullable") and "type" in schema:
            errors.append(f'{shown}: Invalid value: "null": {shown} in body must be of type {schema["type"]}: "null"')
        return
    if not _type_ok(value, schema):
        expected = "integer,string" if schema.get("x-kubernetes-int-or-string") else schema["type"]
        errors.append(f"{shown}: Invalid value: {_show(value)}: {shown} in body must be of type {expected}: "
                      f'"{type(value).__name__}"')
        return
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(json.dumps(v) for v in schema["enum"])
        errors.append(f"{shown}: Unsupported value: {json.dumps(value)}: supported values: {supported}")
    _check_bounds(value, schema, shown, errors)
    if isinstance(value, dict):
        for name in schema.get("required") or []:
            if name not in value:
                errors.append(f"{_join(path, name)}: Required value")
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for name, item in value.items():
            if path == "" and name == "metadata":
                continue
            sub = props.get(name, extra if isinstance(extra, dict) else None)
            if sub is not None:
                old_item = old.get(name) if isinstance(old, dict) else None
                validate(item, sub, _join(path, name), errors, old_item,
                         has_old and isinstance(old, dict) and name in old, gaps)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            validate(item, schema["items"], f"{path}[{i}]", errors, None, False, gaps)
    for combinator in ("allOf", "anyOf", "oneOf"):
        if combinator in schema:
            _check_combinator(combinator, value, schema[combinator], shown, errors)
    for rule in schema.get("x-kubernetes-validations") or []:
        _check_rule(rule, value, old, has_old, path, errors, gaps)


def _check_bounds(value: Any, schema: Schema, shown: str, errors: list[str]) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema:
            low, strict = schema["minimum"], schema.get("exclusiveMinimum") is True
            if value < low or (strict and value == low):
                word = "greater than" if strict else "greater than or equal to"
                errors.append(f"{shown}: Invalid value: {value}: {shown} in body should be {word} {low}")
        if "maximum" in schema:
            high, strict = schema["maximum"], schema.get("exclusiveMaximum") is True
            if value > high or (strict and value == high):
                word = "less than" if strict else "less than or equal to"
                errors.append(f"{shown}: Invalid value: {value}: {shown} in body should be {word} {high}")
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{shown}: Too long: may not be more than {schema['maxLength']} bytes")
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(f"{shown}: Invalid value: {json.dumps(value)}: {shown} in body should be at least "
                          f"{schema['minLength']} chars long")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{shown}: Invalid value: {json.dumps(value)}: {shown} in body should match "
                          f"'{schema['pattern']}'")
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{shown}: Too many: {len(value)}: must have at most {schema['maxItems']} items")
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(f"{shown}: Invalid value: {len(value)}: {shown} in body should have at least "
                          f"{schema['minItems']} items")
    if isinstance(value, dict):
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            errors.append(f"{shown}: Too many: {len(value)}: must have at most {schema['maxProperties']} items")
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            errors.append(f"{shown}: Invalid value: {len(value)}: {shown} in body should have at least "
                          f"{schema['minProperties']} properties")


def _check_combinator(kind: str, value: Any, options: list[Schema], shown: str, errors: list[str]) -> None:
    passing = 0
    for option in options:
        option_errors: list[str] = []
        validate(value, option, shown, option_errors)
        passing += not option_errors
    if (kind == "allOf" and passing < len(options)) or (kind == "anyOf" and passing == 0) \
            or (kind == "oneOf" and passing != 1):
        errors.append(f"{shown}: Invalid value: {_show(value)}: {shown} in body must match {kind} schemas")


def _check_rule(rule: dict[str, Any], value: Any, old: Any, has_old: bool, path: str, errors: list[str],
                gaps: list[str] | None) -> None:
    expression = rule.get("rule", "")
    if "oldSelf" in expression and not has_old:
        return  # transition rules only run on updates, like the API server
    field_path = path + (rule.get("fieldPath") or "")
    shown = field_path or "<root>"
    try:
        ok = cel.evaluate(expression, value, old, has_old)
    except cel.CelUnsupported as err:
        if gaps is not None:
            gaps.append(f"{shown}: rule {expression!r} not evaluated: {err}")
        return
    except cel.CelError as err:
        errors.append(f"{shown}: Invalid value: {_show(value)}: {rule.get('message') or expression}: "
                      f"evaluation error: {err}")
        return
    if not ok:
        message = rule.get("message") or f"failed rule: {expression}"
        errors.append(f"{shown}: Invalid value: {_show(value)}: {message}")


def admit(obj: dict[str, Any], schema: Schema, old: dict[str, Any] | None) -> tuple[dict[str, Any], list[str],
                                                                                     list[str]]:
    """Prune, default and validate a custom resource; return (object, unknown field paths, errors)."""
    dropped: list[str] = []
    obj = prune(obj, schema, "", dropped)
    obj = apply_defaults(obj, schema)
    errors: list[str] = []
    validate(obj, schema, "", errors, old, old is not None)
    return obj, dropped, errors
