"""The project's local Kubernetes test cluster: an API emulator (asyncio/aiohttp) and a process kubelet.

`python -m tests.k8s_emulator up --kubeconfig PATH` runs it in the background for kubectl and people;
`tests.k8s_emulator.fixtures.start_cluster()` runs it inside a test process. See docs/test-cluster.md.
"""
