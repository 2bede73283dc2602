module flywheel/tests/k8s/pause

go 1.26.0
