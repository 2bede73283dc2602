#!/usr/bin/env bash
# Makes a Debian bookworm base image with Python 3.11 from the Debian archive, for machines that reach no container
# registry (the Dockerfile's default base, python:3.11-slim-bookworm, is pulled from one). Prints its name.
#   scripts/image/base.sh            # localhost/flywheel-base:bookworm-<key>; nothing is done when it exists
# The key hashes this script, so a change to what goes into the base makes a new one.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$HERE/containers.conf}"
SUITE=bookworm
PACKAGES=python3,python3-venv,ca-certificates
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
KEY="$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-12)"
NAME="localhost/flywheel-base:$SUITE-$KEY"

log() { printf 'image/base: %s\n' "$*" >&2; }

if podman image exists "$NAME"; then
  log "$NAME exists"
  echo "$NAME"
  exit 0
fi
command -v debootstrap >/dev/null || { log "debootstrap is missing (apt-get install debootstrap)"; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$SECONDS
log "debootstrap --variant=minbase $SUITE ($PACKAGES) from $MIRROR"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$work/root" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
  || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
# The Dockerfile runs `python` (as the official python images name it).
ln -sfn python3 "$work/root/usr/bin/python"
# What an image needs no copy of: the package lists and the fetched .debs (apt-get update refetches them), docs.
rm -rf "$work/root/var/lib/apt/lists/"* "$work/root/var/cache/apt/"*.bin "$work/root/var/cache/apt/archives/"*.deb \
  "$work/root/usr/share/doc/"* "$work/root/usr/share/man/"* "$work/root/usr/share/info/"*
tar --numeric-owner -C "$work/root" -c . | podman import --quiet \
  --change 'CMD ["/bin/bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  - "$NAME" >/dev/null
log "$NAME in $((SECONDS - start)) s, $(podman image inspect --format '{{.Size}}' "$NAME") bytes"
echo "$NAME"
