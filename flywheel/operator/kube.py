"""Re-exported for the operator's modules: the client lives in flywheel/kube/client.py (shared with the API)."""

from flywheel.kube.client import Connection, Credentials, Kube, KubeApiError, KubeConfigError, load_credentials

__all__ = ["Connection", "Credentials", "Kube", "KubeApiError", "KubeConfigError", "load_credentials"]
