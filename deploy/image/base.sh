#!/usr/bin/env bash
# The local stand-in for python:3.11-slim-bookworm where no registry is reachable: a Debian
# bookworm root file system (debootstrap, minbase) with Debian's python3, imported into buildah's
# store as localhost/bookworm-python3:latest. The rootfs tarball is cached under /var/cache
# (keyed by this script's contents and the arch), so CI bootstraps it once per machine.
#
#   bash deploy/image/base.sh [amd64|arm64]     # prints the image name (amd64 default)
set -euo pipefail
ARCH=${1:-amd64}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
HERE=$(cd "$(dirname "$0")" && pwd)
STORE=(--storage-driver vfs)
KEY=$(cat "$0" | sha256sum | cut -c1-12)
CACHE=${LIDARSEG_IMAGE_CACHE:-/var/cache/lidarseg-image}
TARBALL=$CACHE/bookworm-python3-$ARCH-$KEY.tar
IMAGE=localhost/bookworm-python3-$ARCH:$KEY
mkdir -p "$CACHE"
if [ ! -f "$TARBALL" ]; then
  ROOT=$(mktemp -d /var/tmp/lidarseg-rootfs.XXXXXX)
  trap 'rm -rf "$ROOT"' EXIT
  start=$(date +%s)
  debootstrap --variant=minbase --arch="$ARCH" --include=python3,python3-venv \
    bookworm "$ROOT" "$MIRROR" >"$CACHE/debootstrap-$ARCH.log" 2>&1 \
    || { tail -30 "$CACHE/debootstrap-$ARCH.log" >&2; exit 1; }
  # This machine's mirror serves an archive snapshot whose Release files have expired dates: its
  # apt setting goes in under a name the Dockerfile's runtime stage removes (BUILD_APT_CONF), so
  # no image ships a build host's apt configuration.
  [ -f /etc/apt/apt.conf.d/99artifact-registry ] && cp /etc/apt/apt.conf.d/99artifact-registry "$ROOT/etc/apt/apt.conf.d/99lidarseg-build-host"
  rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
  tar -C "$ROOT" --numeric-owner -cf "$TARBALL.partial" .
  mv "$TARBALL.partial" "$TARBALL"
  echo "debootstrap $ARCH: $(( $(date +%s) - start )) s" >&2
fi
if ! buildah "${STORE[@]}" inspect --type image "$IMAGE" >/dev/null 2>&1; then
  ctr=$(buildah "${STORE[@]}" from scratch)
  buildah "${STORE[@]}" add "$ctr" "$TARBALL" / >/dev/null
  buildah "${STORE[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 --arch "$ARCH" --os linux "$ctr"
  buildah "${STORE[@]}" commit --rm -q "$ctr" "$IMAGE" >/dev/null
fi
echo "$IMAGE"
