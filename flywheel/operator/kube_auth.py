"""Re-exported for the operator's modules: the credentials loader lives in flywheel/kube/auth.py."""

from flywheel.kube.auth import (
    Connection,
    Credentials,
    KubeConfigError,
    from_kubeconfig,
    load_credentials,
    service_account,
)

__all__ = ["Connection", "Credentials", "KubeConfigError", "from_kubeconfig", "load_credentials", "service_account"]
