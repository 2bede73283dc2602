"""The committed CRD is generated from spec/job.py and is a structural schema that kubectl/the API server accept."""

from pathlib import Path

import yaml

from flywheel.spec.crd.generate import DEFAULT_PATH, build_crd, render_crd

ROOT = Path(__file__).resolve().parents[2]


def test_committed_crd_matches_the_spec():
    committed = (ROOT / DEFAULT_PATH).read_text()
    assert committed == render_crd(), ("crds/ drifted from flywheel/spec/job.py: run `flywheel crd` and commit "
                                      "the result")


def _walk(node, path="$"):
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def test_schema_is_structural():
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        if isinstance(node, dict) and not path.endswith(("properties", "x-kubernetes-validations")):
            assert "$ref" not in node and "anyOf" not in node and "title" not in node, path
            if "properties" in node or "x-kubernetes-preserve-unknown-fields" in node:
                assert node.get("type") == "object", path
            for bound in ("exclusiveMinimum", "exclusiveMaximum"):
                assert isinstance(node.get(bound, True), bool), path


def test_crd_names_columns_and_subresources():
    crd = yaml.safe_load(render_crd())
    assert crd["metadata"]["name"] == "trainingjobs.flywheel.dev"
    assert crd["spec"]["names"]["shortNames"] == ["tj"]
    version = crd["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Phase", "Ready", "Desired", "Spares", "Step",
                                                                        "Restarts", "Age"]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas.target"
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["checkpoint"]["properties"]["async"]["default"] is True
    training = spec["properties"]["trainer"]["properties"]["training"]  # spelled out: CEL checks a default as it is
    assert training["default"] == {k: v["default"] for k, v in training["properties"].items() if "default" in v}
    rules = [r["rule"] for r in spec["properties"]["replicas"]["x-kubernetes-validations"]]
    assert "self.min <= self.max" in rules


def test_committed_spec_reference_matches_the_spec():
    from flywheel.spec.crd.generate import SPEC_DOC_PATH, render_spec_reference

    assert (ROOT / SPEC_DOC_PATH).read_text() == render_spec_reference(), "run `flywheel crd` and commit docs/spec.md"


def _properties(node, path="spec"):
    """(path, schema) of every property under node, through items and additionalProperties."""
    for key, sub in (node.get("properties") or {}).items():
        yield f"{path}.{key}", sub
        yield from _properties(sub, f"{path}.{key}")
    for child, suffix in ((node.get("items"), "[]"), (node.get("additionalProperties"), "{}")):
        if isinstance(child, dict):
            yield from _properties(child, path + suffix)


def _root():
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_every_property_has_a_description():
    # The API server takes nothing but the type at the root's metadata.
    undescribed = [path for path, sub in _properties(_root(), "") if not sub.get("description") and path != ".metadata"]
    assert not undescribed, f"add description= (or a docstring) for: {undescribed}"
    spec = _root()["properties"]["spec"]["properties"]
    for name in ("trainer", "checkpoint", "faultTolerance", "scheduling", "runPolicy"):
        assert len(spec[name]["description"]) > 20, name  # the section's own words, not a placeholder


def _template():
    return _root()["properties"]["spec"]["properties"]["template"]


def test_spec_template_is_the_generated_pod_template():
    template = _template()
    pod = template["properties"]["spec"]["properties"]
    toleration = pod["tolerations"]["items"]["properties"]
    assert set(toleration) == {"key", "operator", "value", "effect", "tolerationSeconds"}
    assert toleration["tolerationSeconds"] == {**toleration["tolerationSeconds"], "type": "integer",
                                               "format": "int64"}
    container = pod["containers"]["items"]
    assert container["required"] == ["name"] and "containers" not in pod.get("required", [])
    quantity = container["properties"]["resources"]["properties"]["limits"]["additionalProperties"]
    assert quantity["x-kubernetes-int-or-string"] is True and "type" not in quantity  # quantities: 2 or "500m"
    port = container["properties"]["livenessProbe"]["properties"]["httpGet"]["properties"]["port"]
    assert port.get("x-kubernetes-int-or-string") is True and "type" not in port
    assert set(template["properties"]["metadata"]["properties"]) == {"labels", "annotations"}
    assert "ephemeralContainers" not in pod  # a pod cannot be created with them


def test_pod_template_uses_only_what_a_crd_accepts():
    allowed = {"description", "type", "format", "required", "items", "properties", "additionalProperties",
               "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-validations",
               "enum", "default", "minimum", "maximum", "pattern", "minLength", "maxLength", "minItems", "maxItems",
               "maxProperties", "x-kubernetes-list-type", "x-kubernetes-list-map-keys"}
    for path, sub in [("spec.template", _template()), *_properties(_template(), "spec.template")]:
        assert set(sub) <= allowed, (path, set(sub) - allowed)
        assert isinstance(sub.get("type", ""), str), path  # one type, no ["string", "null"]


def test_template_is_inserted_even_when_the_model_declares_it():
    from flywheel.spec import TrainingJobSpec
    from flywheel.spec.crd.generate import openapi_schema, spec_schema_with_template

    declared = openapi_schema(TrainingJobSpec, "spec")
    declared["properties"]["template"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                                          "description": "The model's words."}
    merged = spec_schema_with_template(declared)["properties"]["template"]
    assert merged["description"] == "The model's words."
    assert "x-kubernetes-preserve-unknown-fields" not in merged and "tolerations" in merged["properties"]["spec"][
        "properties"]


def test_operator_owned_pod_fields_and_kueue_metadata_have_one_template_rule_each_in_the_operators_words():
    """Each template rule carries what spec/pod_template.py refuses, with the same message (one definition: `kubectl
    apply` and the operator's Invalid condition say the same); tests/k8s/test_crd_rules_server.py asks a real API
    server that each refuses its case and only that."""
    from flywheel.spec.pod_template import (
        KUEUE_KEYS,
        METADATA_MAPS,
        OWNED_POD_FIELDS,
        kueue_key_problem,
        owned_field_problem,
        template_problems,
    )

    rules = _template()["x-kubernetes-validations"]
    cases = [({"spec": {key: "x"}}, owned_field_problem(key)) for key in OWNED_POD_FIELDS]
    cases += [({"metadata": {where: {"team": "a", key: "x"}}}, kueue_key_problem(where, key))
              for where in METADATA_MAPS for key in KUEUE_KEYS]
    assert sorted(r["message"] for r in rules) == sorted(message for _, message in cases)
    for template, message in cases:
        assert template_problems(template, "/ckpt") == [message]


def test_crd_fits_the_object_and_last_applied_limits():
    from flywheel.spec.crd.generate import MAX_ANNOTATION_BYTES, MAX_OBJECT_BYTES, crd_sizes

    sizes = crd_sizes()
    assert sizes["object"] < MAX_OBJECT_BYTES
    assert sizes["lastApplied"] < MAX_ANNOTATION_BYTES  # client-side `kubectl apply` works
    assert sizes["object"] > 50_000  # the pod template is really in it


def test_chart_ships_the_same_crd():
    chart = ROOT / "charts" / "flywheel" / "crds" / DEFAULT_PATH.name
    assert chart.read_text() == (ROOT / DEFAULT_PATH).read_text(), "copy crds/ to charts/flywheel/crds/"
