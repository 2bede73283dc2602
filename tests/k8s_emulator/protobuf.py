"""Decoding of Kubernetes protobuf request bodies for the few built-in kinds typed clients send that way
(client-go typed clients: `kubectl create namespace|configmap|secret|pdb`, Helm's release Secrets).

A body is `k8s\\x00` + runtime.Unknown{typeMeta{apiVersion, kind}, raw}; `raw` is the object in the field
numbering of k8s.io/api generated.proto. Kinds without a table here are refused with 415.
"""

from __future__ import annotations

import base64
import datetime
from typing import Any

MAGIC = b"k8s\x00"

# Field tables: number -> (JSON name, type). Types: str, int, bool, bytes (base64 in JSON), time, map, mapbytes,
# strs (repeated string), intstr (an IntOrString: JSON's int or string), or a nested table; a 1-tuple around a table
# means a repeated message.
_TIME = "time"
_INT_OR_STRING = "intstr"
_LABEL_SELECTOR = {1: ("matchLabels", "map"),
                   2: ("matchExpressions", ({1: ("key", "str"), 2: ("operator", "str"), 3: ("values", "strs")},))}
_OWNER_REF = {1: ("kind", "str"), 3: ("name", "str"), 4: ("uid", "str"), 5: ("apiVersion", "str"),
              6: ("controller", "bool"), 7: ("blockOwnerDeletion", "bool")}
_OBJECT_META = {1: ("name", "str"), 2: ("generateName", "str"), 3: ("namespace", "str"), 5: ("uid", "str"),
                6: ("resourceVersion", "str"), 7: ("generation", "int"), 8: ("creationTimestamp", _TIME),
                9: ("deletionTimestamp", _TIME), 10: ("deletionGracePeriodSeconds", "int"), 11: ("labels", "map"),
                12: ("annotations", "map"), 13: ("ownerReferences", (_OWNER_REF,)), 14: ("finalizers", "strs")}
KINDS: dict[str, dict[int, tuple[str, Any]]] = {
    "ConfigMap": {1: ("metadata", _OBJECT_META), 2: ("data", "map"), 3: ("binaryData", "mapbytes"),
                  4: ("immutable", "bool")},
    "Secret": {1: ("metadata", _OBJECT_META), 2: ("data", "mapbytes"), 3: ("type", "str"), 4: ("stringData", "map"),
               5: ("immutable", "bool")},
    "Namespace": {1: ("metadata", _OBJECT_META), 2: ("spec", {1: ("finalizers", "strs")}),
                  3: ("status", {1: ("phase", "str")})},
    "ServiceAccount": {1: ("metadata", _OBJECT_META)},
    "PodDisruptionBudget": {1: ("metadata", _OBJECT_META),  # `kubectl create pdb`
                            2: ("spec", {1: ("minAvailable", _INT_OR_STRING), 2: ("selector", _LABEL_SELECTOR),
                                         3: ("maxUnavailable", _INT_OR_STRING),
                                         4: ("unhealthyPodEvictionPolicy", "str")})},
    "DeleteOptions": {1: ("gracePeriodSeconds", "int"), 2: ("preconditions", {1: ("uid", "str"),
                                                                                2: ("resourceVersion", "str")}),
                      3: ("orphanDependents", "bool"), 4: ("propagationPolicy", "str"), 5: ("dryRun", "strs")},
}


class UnsupportedProtobuf(Exception):
    pass


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, varint value or length-delimited bytes) in order; fixed-width fields are skipped."""
    fields, pos = [], 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            fields.append((number, value))
        elif wire == 2:
            length, pos = _varint(data, pos)
            fields.append((number, data[pos:pos + length]))
            pos += length
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise UnsupportedProtobuf(f"wire type {wire}")
    return fields


def _time(raw: bytes) -> str:
    seconds = next((v for n, v in _fields(raw) if n == 1), 0)
    moment = datetime.datetime.fromtimestamp(int(seconds), datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _int_or_string(raw: bytes) -> int | str:
    parts = dict(_fields(raw))  # type 1 (0 int, 1 string), intVal 2 (int32, negative as 64-bit), strVal 3
    if parts.get(1) == 1:
        return bytes(parts.get(3, b"")).decode()
    number = int(parts.get(2, 0))
    return number - (1 << 64) if number >= 1 << 63 else number


def _map_entry(raw: bytes) -> tuple[str, bytes]:
    entry = dict(_fields(raw))
    return bytes(entry.get(1, b"")).decode(), bytes(entry.get(2, b""))


def _message(raw: bytes, table: dict[int, tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for number, value in _fields(raw):
        if number not in table:
            continue
        name, kind = table[number]
        if kind == "str":
            if value:  # gogo-protobuf writes empty strings; JSON would omit them (omitempty)
                obj[name] = bytes(value).decode()
        elif kind == "int":
            obj[name] = value
        elif kind == "bool":
            obj[name] = bool(value)
        elif kind == "bytes":
            obj[name] = base64.b64encode(bytes(value)).decode()
        elif kind == _TIME:
            obj[name] = _time(bytes(value))
        elif kind == _INT_OR_STRING:
            obj[name] = _int_or_string(bytes(value))
        elif kind in ("map", "mapbytes"):
            key, item = _map_entry(bytes(value))
            obj.setdefault(name, {})[key] = item.decode() if kind == "map" else base64.b64encode(item).decode()
        elif kind == "strs":
            obj.setdefault(name, []).append(bytes(value).decode())
        elif isinstance(kind, tuple):
            obj.setdefault(name, []).append(_message(bytes(value), kind[0]))
        else:
            obj[name] = _message(bytes(value), kind)
    return obj


def decode(body: bytes) -> dict[str, Any]:
    if not body.startswith(MAGIC):
        raise UnsupportedProtobuf("missing the k8s protobuf magic prefix")
    envelope = dict(_fields(body[len(MAGIC):]))
    type_meta = dict(_fields(bytes(envelope.get(1, b""))))
    api_version, kind = bytes(type_meta.get(1, b"")).decode(), bytes(type_meta.get(2, b"")).decode()
    if kind not in KINDS:
        raise UnsupportedProtobuf(f"protobuf bodies of kind {kind!r}")
    return {"apiVersion": api_version, "kind": kind, **_message(bytes(envelope.get(2, b"")), KINDS[kind])}
