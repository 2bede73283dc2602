"""The test cluster's schema validation takes an int-or-string node (quantities, ports) as a real API server does:
an integer or a string, nothing else (the generated pod template in the CRD relies on it)."""

import pytest

from tests.k8s_emulator import schema

NODE = {"x-kubernetes-int-or-string": True}


@pytest.mark.parametrize("value", [2, "500m", "http"])
def test_integers_and_strings_pass(value):
    errors: list[str] = []
    schema.validate(value, NODE, "spec.cpu", errors)
    assert errors == []


@pytest.mark.parametrize("value", [[1], {"a": 1}, True])
def test_anything_else_is_refused_as_integer_or_string(value):
    errors: list[str] = []
    schema.validate(value, NODE, "spec.cpu", errors)
    assert errors and "must be of type integer,string" in errors[0], errors
