#!/usr/bin/env bash
# Builds the Dockerfile as it is (`make image`) and prints the image's name.
#
#   scripts/image/build.sh                       # IMAGE (default localhost/flywheel:latest)
#   IMAGE=REGISTRY/flywheel:TAG scripts/image/build.sh
#
# Settings (environment):
#   CONTAINER_CLI     podman (default where installed) or docker
#   BASE_IMAGE        the Dockerfile's build arg; unset: python:3.11-slim-bookworm where a registry answers, else
#                     a Debian bookworm base the project makes with debootstrap (scripts/image/base.sh, podman only)
#   TORCH_INDEX_URL   the Dockerfile's build arg; unset: its default (PyTorch's CPU index) where that answers, else
#                     PyPI, whose torch for x86_64 is the CUDA build (it runs on CPUs; several GB of CUDA libraries)
#   FLYWHEEL_EXTRAS   the Dockerfile's build arg (default: the Dockerfile's)
#   BUILD_FLAGS       more flags for `build` (e.g. --layers=false)
#   CONTEXT           the build context (default: this checkout)
# With podman, the RUN steps get a pip configuration mounted read-only (nothing of it stays in the image): constraints.txt
# as pip's constraints, so the image resolves as the tests' venv does and never backtracks, and the CA bundle the
# host's pip uses ($PIP_CERT), where one is set: on machines whose HTTPS goes through an inspecting proxy a
# container reaches the package registries only with it. The build runs on the host's network.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/scripts/image"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$HERE/containers.conf}"
IMAGE="${IMAGE:-localhost/flywheel:latest}"
CONTEXT="${CONTEXT:-$ROOT}"
DEFAULT_BASE=python:3.11-slim-bookworm
DEFAULT_TORCH_INDEX=https://download.pytorch.org/whl/cpu
if [[ -z "${CONTAINER_CLI:-}" ]]; then
  if command -v podman >/dev/null; then CONTAINER_CLI=podman; else CONTAINER_CLI=docker; fi
fi

log() { printf 'image/build: %s\n' "$*" >&2; }

reachable() {  # an HTTPS URL answers within 10 s (any HTTP status counts)
  python3 - "$1" <<'EOF'
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=10)
except urllib.error.HTTPError:
    pass
except Exception:
    sys.exit(1)
EOF
}

if [[ -z "${BASE_IMAGE:-}" ]]; then
  if "$CONTAINER_CLI" image exists "$DEFAULT_BASE" 2>/dev/null || timeout 120 "$CONTAINER_CLI" pull -q "$DEFAULT_BASE" >/dev/null 2>&1; then
    BASE_IMAGE="$DEFAULT_BASE"
  elif [[ "$CONTAINER_CLI" == podman ]]; then
    log "$DEFAULT_BASE cannot be pulled: the base is made with debootstrap"
    BASE_IMAGE="$("$HERE/base.sh")"
  else
    log "$DEFAULT_BASE cannot be pulled; set BASE_IMAGE to a local image whose python is 3.11+"
    exit 1
  fi
fi
if [[ -z "${TORCH_INDEX_URL:-}" ]]; then
  if reachable "$DEFAULT_TORCH_INDEX/torch/"; then
    TORCH_INDEX_URL="$DEFAULT_TORCH_INDEX"
  else
    log "$DEFAULT_TORCH_INDEX cannot be reached: torch comes from PyPI (the CUDA build)"
    TORCH_INDEX_URL=https://pypi.org/simple
  fi
fi

args=(--tag "$IMAGE" --file "$CONTEXT/Dockerfile" --network host
      --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
[[ -z "${FLYWHEEL_EXTRAS:-}" ]] || args+=(--build-arg "FLYWHEEL_EXTRAS=$FLYWHEEL_EXTRAS")
if [[ "$CONTAINER_CLI" == podman ]]; then
  # Mounted over /root, the build's HOME, which both kinds of base have: a mount point that does not exist in the
  # base would be created for the RUN steps and stay in the image, empty.
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/root/.config/pip" "$work/root/flywheel-build"
  cp "$CONTEXT/constraints.txt" "$work/root/flywheel-build/constraints.txt"
  conf="$work/root/.config/pip/pip.conf"
  { echo "[global]"; echo "constraint = /root/flywheel-build/constraints.txt"; } > "$conf"
  cert="${PIP_CERT:-}"
  [[ -n "$cert" ]] || cert="$(pip3 config get global.cert 2>/dev/null || true)"
  if [[ -n "$cert" && -f "$cert" ]]; then
    cp "$cert" "$work/root/flywheel-build/ca.crt"
    echo "cert = /root/flywheel-build/ca.crt" >> "$conf"
  fi
  chmod -R a+rX "$work/root"
  args+=(--volume "$work/root:/root:ro")
fi
# shellcheck disable=SC2086  # BUILD_FLAGS is a list of flags
read -r -a extra <<< "${BUILD_FLAGS:-}"
log "$CONTAINER_CLI build $IMAGE (BASE_IMAGE=$BASE_IMAGE, TORCH_INDEX_URL=$TORCH_INDEX_URL)"
start=$SECONDS
"$CONTAINER_CLI" build "${args[@]}" "${extra[@]}" "$CONTEXT" >&2
size="$("$CONTAINER_CLI" image inspect --format '{{.Size}}' "$IMAGE")"
log "$IMAGE built in $((SECONDS - start)) s; $((size / 1000000)) MB"
echo "$IMAGE"
