"""The test cluster: the real Kubernetes control plane (kube-apiserver, etcd, kube-controller-manager and
kube-scheduler, built from their Go modules: tests/k8s/controlplane) on loopback, and the process kubelet as its
node agent, running pods as local processes.

    python -m tests.cluster up --kubeconfig /tmp/fw/kubeconfig [--nodes 2]
    python -m tests.cluster status|down --kubeconfig /tmp/fw/kubeconfig

In tests: `tests.cluster.fixtures.start_cluster()` and the fixtures there. docs/test-cluster.md says what is real."""
