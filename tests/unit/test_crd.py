"""The committed CRD is generated from spec.py and is a structural schema that kubectl/the API server accept."""

from pathlib import Path

import yaml

from flywheel.crd import DEFAULT_PATH, build_crd, render_crd

ROOT = Path(__file__).resolve().parents[2]


def test_committed_crd_matches_the_spec():
    committed = (ROOT / DEFAULT_PATH).read_text()
    assert committed == render_crd(), "crds/ drifted from flywheel/spec.py: run `flywheel crd` and commit the result"


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
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Phase", "Ready", "Desired", "Step",
                                                                        "Restarts", "Age"]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas.target"
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["checkpoint"]["properties"]["async"]["default"] is True
    assert spec["properties"]["trainer"]["properties"]["training"]["default"] == {}
    rules = [r["rule"] for r in spec["properties"]["replicas"]["x-kubernetes-validations"]]
    assert "self.min <= self.max" in rules


def test_committed_spec_reference_matches_the_spec():
    from flywheel.crd import SPEC_DOC_PATH, render_spec_reference

    assert (ROOT / SPEC_DOC_PATH).read_text() == render_spec_reference(), "run `flywheel crd` and commit docs/spec.md"
