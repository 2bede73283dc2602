"""The Pod API's rules (flywheel/spec/pod_rules/rules.py) as the real API server decides them: each syntax's CEL text
takes what its Python `ok` takes and refuses the rest, and every CEL rule of the table's fields gives Python's verdict
on every node of the table (tests/pod_api_cases.py). Two probe CRDs (tests/k8s/cel_probe.py) carry the rules; each
dry-run create judges many values side by side, the 422 causes naming which were refused. The pure parts are in
tests/spec/test_pod_rules.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from flywheel.spec.field_rules import Check, Keys, Rule, Text, nodes, schema_node
from flywheel.spec.k8s_syntax import Syntax
from flywheel.spec.pod_rules.rules import SPEC_RULES
from tests.k8s.cel_probe import (
    Api,
    api,  # noqa: F401 - the module-scoped control plane
    blocked_properties,
    probe,
    probe_crd,
    spec_schema,
    under,
    without_rules,
)
from tests.pod_api_cases import BASE, GAPS, REFUSED, job
from tests.spec.test_pod_rules import SYNTAXES

pytestmark = pytest.mark.slow

REFUSES = "refused"
# Long enough for every value of SYNTAXES, so that a syntax's own size() check decides, not the schema's maxLength.
MAX_VALUE = 512
CEL_RULES = [r for r in SPEC_RULES if isinstance(r, (Text, Keys, Check))]
PATHS = sorted({r.path for r in CEL_RULES})


def syntax_property(syntax: Syntax, values: list[str]) -> dict[str, Any]:
    return {"type": "array", "maxItems": len(values), "items": {
        "type": "string", "maxLength": MAX_VALUE,
        "x-kubernetes-validations": [{"rule": syntax.cel("self"), "message": REFUSES}]}}


def rules_property(spec: dict[str, Any], path: str) -> dict[str, Any]:
    """The rule path's node of the CRD's spec, with only the rules of that path (each its own message)."""
    node = without_rules(schema_node(spec, path))
    node["x-kubernetes-validations"] = [v for r in CEL_RULES if r.path == path for v in _cel(r)]
    return node


def _cel(rule: Rule) -> list[dict[str, Any]]:
    validations: list[dict[str, Any]] = rule.schema().get("x-kubernetes-validations", [])
    return validations


@pytest.fixture(scope="module")
def probes(api: Api) -> Api:  # noqa: F811 - the fixture imported above
    spec = spec_schema()
    syntaxes = {f"s{i}": syntax_property(s, good + bad) for i, (s, good, bad) in enumerate(SYNTAXES)}
    api.create_crds(probe_crd("syntaxes", syntaxes),
                    probe_crd("podrules", {f"p{i}": rules_property(spec, path) for i, path in enumerate(PATHS)}))
    return api


@pytest.fixture(scope="module")
def syntax_verdicts(probes: Api) -> dict[int, list[bool]]:
    """Per syntax, whether the API server took each of its values (good + bad), from one request for all."""
    values = {f"s{i}": good + bad for i, (_, good, bad) in enumerate(SYNTAXES)}
    causes = probe(probes, "syntaxes", values)
    assert not blocked_properties(causes), causes
    refused = {field for field, message, _ in causes if REFUSES in message}
    return {i: [f"spec.s{i}[{j}]" not in refused for j in range(len(values[f"s{i}"]))]
            for i in range(len(SYNTAXES))}


@pytest.mark.parametrize("index", range(len(SYNTAXES)), ids=[s.message[:40] for s, _, _ in SYNTAXES])
def test_each_syntaxs_cel_takes_what_its_python_takes(syntax_verdicts: dict[int, list[bool]], index: int) -> None:
    syntax, good, bad = SYNTAXES[index]
    assert syntax_verdicts[index] == [True] * len(good) + [False] * len(bad)
    assert [syntax.ok(v) for v in good + bad] == syntax_verdicts[index]


def _nodes_of_the_table() -> list[dict[str, Any]]:
    """The table's specs, with the default the API server writes above the rules' nodes (resources: {})."""
    return [{"resources": {}, **job(change)["spec"]} for _, change, _ in REFUSED + GAPS] + [
        {"resources": {}, **BASE["spec"]}]


def _distinct_values(docs: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Per rule path, the JSON of every distinct node of that path in `docs`."""
    out: dict[str, list[str]] = {}
    for path in PATHS:
        seen = {json.dumps(value, sort_keys=True) for doc in docs for _, value in nodes(doc, path)}
        out[path] = sorted(seen)
    return out


def _judge_round(client: Api, spec: dict[str, Any]) -> dict[str, set[str] | None]:
    """Per probe property: the causes' messages under it, or None where a schema error of its value keeps the API
    server from running CEL (it never runs the rules on such a value; the value is left out and the rest asked
    again)."""
    out: dict[str, set[str] | None] = {}
    while spec:
        causes = probe(client, "podrules", spec)
        blocked = blocked_properties(causes)
        if not blocked:
            out.update({prop: {m for f, m, _ in causes if under(f, prop)} for prop in spec})
            return out
        out.update(dict.fromkeys(blocked))
        spec = {k: v for k, v in spec.items() if k not in blocked}
    return out


@pytest.fixture(scope="module")
def table_verdicts(probes: Api) -> dict[tuple[str, str], set[str] | None]:
    """(rule path, node JSON) -> the messages of the rules the API server refused it for (None: not judged)."""
    values = _distinct_values(_nodes_of_the_table())
    prop = {path: f"p{i}" for i, path in enumerate(PATHS)}
    verdicts: dict[tuple[str, str], set[str] | None] = {}
    for k in range(max(len(v) for v in values.values())):
        spec = {prop[path]: json.loads(v[k]) for path, v in values.items() if k < len(v)}
        judged = _judge_round(probes, spec)
        verdicts.update({(path, v[k]): judged[prop[path]] for path, v in values.items() if k < len(v)})
    return verdicts


def test_the_cel_rules_decide_as_python_does_on_the_table(
        table_verdicts: dict[tuple[str, str], set[str] | None]) -> None:
    compared = 0
    for rule in CEL_RULES:
        for doc in _nodes_of_the_table():
            for where, value in nodes(doc, rule.path):
                refused = table_verdicts[(rule.path, json.dumps(value, sort_keys=True))]
                if refused is None:
                    continue
                took = not any(rule.message in message for message in refused)
                assert took == (not rule.violated(value)), (rule.path, where, value)
                compared += 1
    assert compared > 300


def test_most_nodes_reach_the_rules(table_verdicts: dict[tuple[str, str], set[str] | None]) -> None:
    # Values the schema refuses before CEL runs are few: the comparison above covers the table.
    judged = [v for v in table_verdicts.values() if v is not None]
    assert len(judged) > 0.8 * len(table_verdicts)
    assert sum(bool(v) for v in judged) >= 40  # and many of them are refused by some rule
