"""The product's Kubernetes client, shared by the operator and the REST API: `client.Kube` (a JSON facade over
kubernetes_asyncio, with LIST pages and WATCH streams) and `auth` (kubeconfig / in-cluster credentials, kept
current). kopf keeps its own client for its watches (docs/operator.md, "Kubernetes client")."""

from flywheel.kube import lazy_packages

lazy_packages.install()  # before anything imports kubernetes_asyncio (kopf does, whenever it is installed)
