# Flywheel: the two commands a newcomer needs are `make demo` and `make test`.
PY := .venv/bin/python
PIP := .venv/bin/pip
STAMP := .venv/.installed
BASE_STAMP := .venv/.installed-base
PYTEST_ARGS ?=
# Two test processes, one module at a time each (a module's cluster fixture stays in one process): a serial
# suite left the 2 cores ~40% idle (waits on clusters, timeouts, rendezvous); with two they are ~87% busy, so the
# suite's time follows its CPU (~30-45 minutes here). A worker that dies fails the run at once rather than being
# replaced.
PYTEST_WORKERS ?= 2
# schemathesis gives the items of each API operation one node id, and xdist's controller keeps one item per
# node id (1 operation of 11 was checked): that file runs in a plain pytest process after the rest.
SCHEMATHESIS_TESTS := tests/api/test_schemathesis.py

.DEFAULT_GOAL := all

.PHONY: all demo test test-heavy test-fast lint venv tools crd bench bench-quick clean controlplane constraints e2e image \
	setup test-image

# Installs resolve against constraints.txt (the whole resolution, pinned): a fresh pip install otherwise walked back
# through dozens of botocore releases before it settled. `make constraints` refreshes it after pyproject.toml changes.
$(BASE_STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	# PyPI's torch 2.13.0 (a CUDA build; it runs on the CPU).
	$(PIP) install -q -c constraints.txt -e .
	touch $(BASE_STAMP)

$(STAMP): $(BASE_STAMP)
	$(PIP) install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

constraints:
	$(PY) -m pip install -q uv
	# Seeded with the current pins, which uv keeps where they still fit: an added extra adds its packages without
	# moving everyone else's.
	cp constraints.txt constraints.body
	.venv/bin/uv pip compile pyproject.toml --extra dev --extra cluster --extra hf --extra objectstore --extra bench \
	    --python-version 3.11 --no-header --no-annotate -o constraints.body
	{ printf '%s\n' "# The whole resolution of flywheel[dev,cluster,hf,objectstore,bench] on Python 3.11: installs never backtrack." \
	    "# Refresh after changing pyproject.toml: make constraints"; cat constraints.body; } > constraints.txt
	rm constraints.body

# The Kubernetes control plane of the test cluster (with the kubelet) and its real nodes' containerd and pause, built
# from the Go module proxy into ~/.cache/flywheel (each keyed by its tests/k8s/ module's go.mod, go.sum and main.go:
# a warm cache builds nothing).
controlplane:
	python3 -m tests.cluster build

venv: $(STAMP)

# `make`: the dev install and the control plane (side by side; no test image).
all:
	$(MAKE) -j2 $(STAMP) controlplane

# The dev install, the Go builds and the test image side by side: on a fresh machine the Go build (~13 min of both
# cores) hides most of pip's download of torch and its CUDA libraries and of the image build's (several GB each,
# mostly waiting on the network and the disk), which a test would otherwise wait for. The tools after them
# (install-tools.sh runs pip from the venv when it exists).
setup:
	$(MAKE) -j3 $(STAMP) controlplane test-image
	$(MAKE) tools

# The image tests/image and tests/real_nodes run (scripts/image/test-image.sh: kept by content, so nothing once
# built), after the Debian packages it needs (podman, runc, debootstrap), then imported for the real nodes' containerd
# (`python -m tests.cluster images`: ~5 min for its 5.8 GB, then nothing while it stays the same); where podman
# cannot run, those tests skip.
test-image:
	bash scripts/install-tools.sh --debian-packages
	if CONTAINERS_CONF=scripts/image/containers.conf podman info >/dev/null 2>&1; then \
	    image="$$(bash scripts/image/test-image.sh)" && image="$$(printf '%s\n' "$$image" | tail -n 1)" && \
	    python3 -m tests.cluster images "$$image"; \
	else echo "podman cannot run containers here: tests/image and tests/real_nodes will skip"; fi

tools:
	bash scripts/install-tools.sh

# Run the tiny example on this machine with one injected failure and show the recovery.
demo: $(BASE_STAMP)
	rm -rf runs/tiny
	.venv/bin/flywheel run examples/tiny.yaml --fault kill:rank=1:step=25

test: setup lint
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --max-worker-restart=0 --ignore=$(SCHEMATHESIS_TESTS) -m "not heavy" $(PYTEST_ARGS)
	$(PY) -m pytest -q -p no:xdist $(SCHEMATHESIS_TESTS)

# The long fault scenarios `make test` leaves out (pytest marker `heavy`, pyproject.toml): ~20 min on 2 cores.
test-heavy: setup
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --max-worker-restart=0 -m heavy $(PYTEST_ARGS)

# ruff (lint + import order) and mypy (strict on policy, spec, plan and planner); both must be clean.
lint: $(STAMP)
	.venv/bin/ruff check flywheel tests bench
	.venv/bin/mypy

# Every test but the costly ones, by marker (pyproject.toml; tests/conftest.py sets `cluster` and `gpu` itself): no
# test cluster, no GPU, no multi-process run of ~10 s or more, no heavy scenario.
FAST := not slow and not cluster and not heavy and not gpu
test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --ignore=$(SCHEMATHESIS_TESTS) -m "$(FAST)" $(PYTEST_ARGS) tests
	$(PY) -m pytest -q -p no:xdist -m "$(FAST)" $(SCHEMATHESIS_TESTS)

crd: $(STAMP)
	.venv/bin/flywheel crd

# tests/e2e_real whole (make test runs a part of it): on $$KUBECONFIG's cluster, else on its own test cluster.
e2e: setup
	PATH="$(CURDIR)/.tools/bin:$$PATH" FLYWHEEL_E2E_ALL=1 $(PY) -m pytest -q -p no:xdist tests/e2e_real

# The Dockerfile's image, as localhost/flywheel:latest (IMAGE=... names it; scripts/image/build.sh lists the
# settings): podman's, from a Debian base made with debootstrap where no container registry answers.
image:
	bash scripts/image/build.sh

bench: $(STAMP)
	$(PY) -m bench

bench-quick: $(STAMP)
	$(PY) -m bench --quick

clean:
	rm -rf runs .pytest_cache build *.egg-info
