"""Tests of the test cluster itself and of what only a real API server can judge, on the real control plane."""

from tests.cluster.fixtures import cluster  # noqa: F401 - the module-scoped fixture
