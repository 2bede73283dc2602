#!/usr/bin/env bash
# The image the tests run (tests/image), printed by name: the Dockerfile built as `make image` builds it, kept under
# a key of what decides its dependencies, with this checkout's flywheel/ put in place of the package it installed.
#
#   localhost/flywheel-test:deps-KEY   the Dockerfile's image; KEY hashes the Dockerfile, pyproject.toml,
#                                      constraints.txt and these scripts: built only when missing (minutes, several
#                                      GB), and the older keys' images are removed then
#   localhost/flywheel-test:latest     that image with flywheel/ copied over the installed package (seconds;
#                                      nothing when its label says it holds the same package already)
#
# So a change to the package's code costs a copy, not a rebuild of the venv, and the tests still run the checkout.
# SOURCE (default: this checkout) is the tree whose Dockerfile, dependency files and flywheel/ are used, e.g. an
# export of HEAD while the working tree is mid-change.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/scripts/image"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$HERE/containers.conf}"
REPO=localhost/flywheel-test
SOURCE="${SOURCE:-$ROOT}"
KEY="$(cat "$SOURCE/Dockerfile" "$SOURCE/pyproject.toml" "$SOURCE/constraints.txt" "$HERE/build.sh" "$HERE/base.sh" \
  "$HERE/containers.conf" | sha256sum | cut -c1-12)"
DEPS="$REPO:deps-$KEY"
IMAGE="$REPO:latest"

log() { printf 'image/test-image: %s\n' "$*" >&2; }

if podman image exists "$DEPS"; then
  log "$DEPS exists"
else
  # No layer cache: the build stage's layers (the whole venv again) would stay on disk beside the image.
  IMAGE="$DEPS" CONTEXT="$SOURCE" BUILD_FLAGS="--layers=false" "$HERE/build.sh" >/dev/null
  for old in $(podman images --format '{{.Repository}}:{{.Tag}}' "$REPO"); do
    [[ "$old" == "$DEPS" || "$old" == "$IMAGE" ]] || podman rmi --force "$old" >/dev/null
  done
  podman image prune --force >/dev/null
fi

# The checkout's package by content: an image already built of it is kept, so one that another test process is
# saving or running (tests/real_nodes imports it into containerd) is never pruned from under it.
SOURCE_KEY="$(cd "$SOURCE" && find flywheel -name __pycache__ -prune -o -type f -print0 | LC_ALL=C sort -z \
  | xargs -0 sha256sum | cat - <(echo "$DEPS") | sha256sum | cut -c1-16)"
if [[ "$(podman image inspect --format '{{index .Labels "dev.flywheel.source"}}' "$IMAGE" 2>/dev/null)" \
      == "$SOURCE_KEY" ]]; then
  log "$IMAGE holds this checkout's package ($SOURCE_KEY)"
  echo "$IMAGE"
  exit 0
fi

site="$(podman run --rm --network none --entrypoint python "$DEPS" -c \
  'import flywheel, os; print(os.path.dirname(os.path.dirname(flywheel.__file__)))')"
ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
tar -C "$SOURCE" --exclude=__pycache__ -c flywheel | tar -C "$ctx" -x
# The installed package goes first, so a module the checkout moved or deleted is not left behind to be imported.
cat > "$ctx/Containerfile" <<EOF
FROM $DEPS
USER 0
RUN rm -rf $site/flywheel
COPY flywheel $site/flywheel
USER 10001:10001
EOF
podman build --quiet --layers=false --network none --label "dev.flywheel.source=$SOURCE_KEY" --tag "$IMAGE" "$ctx" \
  >/dev/null
podman image prune --force >/dev/null
echo "$IMAGE"
