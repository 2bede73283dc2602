"""The process kubelet: the test cluster's node agent (tests/cluster/kubelet.py makes it a client of the real API
server), which runs each pod as host processes -- sandbox, images, init containers and sidecars, probes, hooks,
termination -- in place of a container runtime. docs/test-cluster.md says what it does differently."""
