"""JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch.

Strategic merge knows the list-merge keys of the built-in types the project uses (containers, env, ports,
volumes, conditions, ownerReferences, ...) by field name, not by full schema path; any other list is replaced,
as a merge patch would. Directives supported: `$patch: replace|delete` in maps and list items,
`$deleteFromPrimitiveList/<field>`, `$retainKeys` (ignored), `$setElementOrder/<field>` (ignored).
"""

from __future__ import annotations

import copy
from typing import Any

from tests.k8s_emulator.errors import StatusError

# Field name -> merge key for lists that strategic merge merges by key (from the core/v1 Go struct tags; a Node's
# `taints` have none: kubectl taint sends the whole new list, which replaces the old one).
MERGE_KEYS: dict[str, str] = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
    "volumes": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath", "ports": "containerPort",
    "imagePullSecrets": "name", "conditions": "type", "ownerReferences": "uid", "hostAliases": "ip",
    "containerStatuses": "name", "initContainerStatuses": "name", "podIPs": "ip",
    "addresses": "type", "resourceClaims": "name", "topologySpreadConstraints": "topologyKey",
}
# Lists of scalars that strategic merge unions instead of replacing.
MERGED_PRIMITIVE_LISTS = {"finalizers"}


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise StatusError(422, "Invalid", f"JSON pointer must start with '/': {path!r}")
    return [_unescape(t) for t in path[1:].split("/")]


def _walk(doc: Any, tokens: list[str]) -> Any:
    for token in tokens:
        if isinstance(doc, list):
            doc = doc[int(token)]
        elif isinstance(doc, dict):
            doc = doc[token]
        else:
            raise KeyError(token)
    return doc


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _walk(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, list):
        parent.insert(len(parent) if last == "-" else int(last), value)
    else:
        parent[last] = value
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    parent = _walk(doc, tokens[:-1])
    if isinstance(parent, list):
        return parent.pop(int(tokens[-1]))
    return parent.pop(tokens[-1])


def json_patch(target: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise StatusError.bad_request("json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        kind, tokens = op.get("op"), _pointer(op.get("path", ""))
        try:
            if kind == "add":
                doc = _add(doc, tokens, copy.deepcopy(op["value"]))
            elif kind == "remove":
                _remove(doc, tokens)
            elif kind == "replace":
                _walk(doc, tokens)  # the target must exist
                if not tokens:
                    doc = copy.deepcopy(op["value"])
                else:
                    parent = _walk(doc, tokens[:-1])
                    parent[int(tokens[-1]) if isinstance(parent, list) else tokens[-1]] = copy.deepcopy(op["value"])
            elif kind == "move":
                value = _remove(doc, _pointer(op["from"]))
                doc = _add(doc, tokens, value)
            elif kind == "copy":
                doc = _add(doc, tokens, copy.deepcopy(_walk(doc, _pointer(op["from"]))))
            elif kind == "test":
                if _walk(doc, tokens) != op.get("value"):
                    raise StatusError(422, "Invalid", f"the server rejected our request: test failed at {op['path']}")
            else:
                raise StatusError.bad_request(f"unknown json patch op {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as err:
            raise StatusError(422, "Invalid",
                           f"the server rejected our request: {kind} {op.get('path')}: {err!r}") from None
    return doc


def _merge_keyed_list(target: list[Any], patch: list[Any], key: str) -> list[Any]:
    result = copy.deepcopy(target)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            result.append(copy.deepcopy(item))
            continue
        index = next((i for i, old in enumerate(result) if isinstance(old, dict) and old.get(key) == item[key]), None)
        directive = item.get("$patch")
        if directive == "delete":
            if index is not None:
                result.pop(index)
        elif directive == "replace" or index is None:
            clean = {k: v for k, v in item.items() if k != "$patch"}
            if index is None:
                result.append(strategic_merge({}, clean))
            else:
                result[index] = clean
        else:
            result[index] = strategic_merge(result[index], item)
    return result


def strategic_merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list) and key in MERGE_KEYS:
            result[key] = _merge_keyed_list(result[key], value, MERGE_KEYS[key])
        elif isinstance(value, list) and isinstance(result.get(key), list) and key in MERGED_PRIMITIVE_LISTS:
            result[key] = result[key] + [v for v in value if v not in result[key]]
        elif isinstance(value, dict):
            merged = strategic_merge(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = copy.deepcopy(value)
    return result
