#!/usr/bin/env bash
# Builds the top-level Dockerfile's CPU image here, with buildah, on the local bookworm base
# (deploy/image/base.sh) instead of python:3.11-slim-bookworm (no registry is reachable).
# pip's CA bundle ($PIP_CERT) goes in as a build secret and the local wheel folder
# (/opt/wheels: the CPU torch) as a read-only bind mount; neither stays in the image.
# --format docker: the OCI format has no HEALTHCHECK. No --layers: vfs (the only storage driver
# that works here) keeps a full copy of the root file system per layer, so a layer cache costs
# tens of GB; without it a build keeps only its final image (about 2.4 GB; `buildah rmi` it after
# use, as .ci/steps/40-image.sh does).
#
#   bash deploy/image/build.sh [TAG]      # default localhost/lidarseg:cpu; prints size and time
set -euo pipefail
cd "$(dirname "$0")/../.."
TAG=${1:-localhost/lidarseg:cpu}
STORE=(--storage-driver vfs)
start=$SECONDS
BASE=$(bash deploy/image/base.sh)
base_s=$((SECONDS - start))
ARGS=(--build-arg "BASE_IMAGE=$BASE" --build-arg "VERSION=$(git describe --always --dirty)"
      --build-arg "REVISION=$(git rev-parse HEAD)")
if [ -n "${PIP_CERT:-}" ]; then ARGS+=(--secret "id=pipcert,src=$PIP_CERT"); fi
WHEELS=${LIDARSEG_WHEELS:-/opt/wheels}
if [ -d "$WHEELS" ]; then
  ARGS+=(-v "$WHEELS:/wheels:ro" --build-arg PIP_FIND_LINKS=/wheels --build-arg TORCH_INDEX_URL=)
fi
buildah "${STORE[@]}" bud --isolation chroot --format docker --target cpu "${ARGS[@]}" -t "$TAG" . >&2
build_s=$((SECONDS - start - base_s))
size=$(buildah "${STORE[@]}" images --format '{{.Size}}' "$TAG" | head -1)
echo "image $TAG: $size; base $base_s s, build $build_s s" >&2
echo "$TAG"
