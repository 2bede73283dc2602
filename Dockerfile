# syntax=docker/dockerfile:1
# One image for the operator (`flywheel operator`), the REST API (`flywheel api`) and the workers (the operator
# starts them with `python -m flywheel.cli launch`).
#
#   docker build -t flywheel:latest .                                   # CPU torch wheel (default)
#   docker build -t flywheel:cu128 \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .  # CUDA torch wheel (bundles CUDA libs)
#   docker build --build-arg BASE_IMAGE=<a CUDA base with python3.11 as `python`> ...
#
# tests/chart/test_dockerfile.py checks that these steps agree with pyproject.toml (package, extras, torch pin,
# Python version) and that the final stage runs as a non-root user.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
# Equal to the torch pin in pyproject.toml's dependencies (a test checks).
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# The operator and the API need kopf, aiohttp and kubernetes_asyncio (pyproject.toml's `cluster` extra); workers
# need tokenizers, tiktoken and pyarrow for real models and data (`hf`), s3fs for s3:// checkpoints (`objectstore`), and
# a user script's framework for flywheel.integrations' callbacks (`hf-trainer`: transformers, accelerate; `lightning`).
ARG FLYWHEEL_EXTRAS=cluster,hf,objectstore,hf-trainer,lightning
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first, from its own index, so that the package install below finds the pin satisfied and pulls no other
# build of it.
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY flywheel ./flywheel
# The package itself (a local path: its dependencies are pinned or bounded in pyproject.toml).
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[${FLYWHEEL_EXTRAS}]" \
    && python -c "import flywheel.cli, flywheel.operator.main, flywheel.api.server, flywheel.kube.client, \
                      kopf, aiohttp, kubernetes_asyncio, torch"

FROM ${BASE_IMAGE} AS runtime
LABEL org.opencontainers.image.title="flywheel" \
      org.opencontainers.image.description="Kubernetes-native fault-tolerant training: operator, API, workers"
RUN groupadd --system --gid 10001 flywheel \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/flywheel --create-home \
       --shell /usr/sbin/nologin flywheel
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/flywheel
WORKDIR /home/flywheel
USER 10001:10001
ENTRYPOINT ["flywheel"]
CMD ["--help"]
